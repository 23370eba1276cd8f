/// The HTTP endpoints of the coordinator, shared by the server's router and the client SDK.
///
/// Device endpoints other than `authenticate` take `Authorization: Bearer <session token>`
/// (the token from ``AuthenticateResponse``); admin endpoints take `Authorization: Bearer <admin token>`.
public enum Endpoint {
    /// `GET`: liveness, `{"status":"ok"}`.
    public static let health = "/health"
    /// `GET`: Prometheus text exposition.
    public static let metrics = "/metrics"
    /// `GET`: the OpenAPI 3 document of this API.
    public static let openAPI = "/openapi.json"

    /// `POST` ``AuthenticateRequest`` → ``AuthenticateResponse``.
    public static let authenticate = "/v1/device/authenticate"
    /// `POST` ``CycleRequest`` → ``CycleResponse``.
    public static let cycleRequest = "/v1/device/cycle-request"
    /// `GET ?request_key=…[&format=mlmodel]`: the model's weights as safetensors, or (``ModelFormat/mlmodel``) the
    /// whole model as an updatable Core ML file; both support `ETag`/`If-None-Match` and `Range`.
    public static func model(_ modelID: String) -> String { "/v1/device/models/\(modelID)" }
    /// `GET ?request_key=…` → ``TrainingPlan``.
    public static func plan(_ planID: String) -> String { "/v1/device/plans/\(planID)" }
    /// `POST` a report (safetensors diff with ``ReportMetadata``, see ``ReportEnvelope``) → ``ReportResponse``.
    public static let report = "/v1/device/report"
    /// `POST` ``EvaluationReport`` → ``EvaluationReportResponse``: a device's result of an evaluation task.
    public static let evaluationReport = "/v1/device/evaluation-report"
    /// `POST` ``SecureAggregationRequest`` → ``SecureAggregationReply``: a device's step in its cycle's secure
    /// aggregation (processes with ``ServerConfig/secureAggregation``).
    public static let secureAggregation = "/v1/device/secure-aggregation"
    /// With a session of a process that gates cycles on link speed: `GET ?bytes=N` downloads N bytes (at most the
    /// process's ``ServerConfig/speedTestDownloadBytes``, which it sends when N is omitted); `POST` uploads up to
    /// ``ServerConfig/speedTestUploadBytes`` and answers ``SpeedTestUploadResponse``. Each direction is limited per
    /// worker in time (429 `rate_limited` with `Retry-After`).
    public static let speedTest = "/v1/device/speed-test"

    /// `POST` ``HostProcessRequest`` → ``ProcessStatus`` (201); `GET` → ``ProcessList``.
    public static let processes = "/v1/admin/processes"
    /// `GET` → ``ProcessStatus``; `DELETE` → 204.
    public static func process(_ processID: String) -> String { "/v1/admin/processes/\(processID)" }
    /// `GET`: a checkpoint's weights as safetensors; `number` is a checkpoint number or `latest`.
    public static func checkpoint(_ processID: String, _ number: String) -> String {
        "/v1/admin/processes/\(processID)/checkpoints/\(number)"
    }

    /// `GET` → ``ProcessCycles``: the process's recently closed cycles (outcome, participation, mean device metrics)
    /// as the answering coordinator saw them close (kept in its memory).
    public static func cycles(_ processID: String) -> String { "/v1/admin/processes/\(processID)/cycles" }
    /// `PUT` the process's held-out data (the file `orchard data prepare` writes, as `application/octet-stream`) →
    /// ``ProcessEvaluations`` with the current checkpoint evaluated on it; `DELETE` → 204; `GET` → ``ProcessEvaluations``.
    /// The coordinator evaluates every checkpoint it publishes on the data, off the request path.
    public static func evaluation(_ processID: String) -> String { "/v1/admin/processes/\(processID)/evaluation" }
    /// `GET`: the dashboard page (HTML); admin data only with a session cookie or the admin token.
    public static let dashboard = "/dashboard"
    /// `GET ?token=…`: redeems a one-time login token for a dashboard session cookie (303 to ``dashboard``); `POST` (a
    /// form's `token`) takes a login token or the admin token.
    public static let dashboardLogin = "/dashboard/login"
    /// `POST`: ends the dashboard session (303 to ``dashboard``).
    public static let dashboardLogout = "/dashboard/logout"

    /// The names of the path parameters in the server's routes (e.g. `model(":\(Parameter.model)")`).
    public enum Parameter {
        /// The model id of ``Endpoint/model(_:)``.
        public static let model = "model"
        /// The plan id of ``Endpoint/plan(_:)``.
        public static let plan = "plan"
        /// The process id of ``Endpoint/process(_:)`` and ``Endpoint/checkpoint(_:_:)``.
        public static let process = "process"
        /// The checkpoint number (or `latest`) of ``Endpoint/checkpoint(_:_:)``.
        public static let checkpoint = "checkpoint"
    }

    /// The query parameter carrying the request key on model and plan downloads.
    public static let requestKeyQuery = "request_key"
    /// The query parameter carrying the byte count of a speed-test download.
    public static let bytesQuery = "bytes"
    /// The query parameter choosing a model download's ``ModelFormat``.
    public static let formatQuery = "format"
}

/// How a model download is represented.
public enum ModelFormat: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// The weights as safetensors (`application/vnd.safetensors`), for Orchard's engine; the default.
    case safetensors
    /// The architecture and weights as an updatable Core ML model (`application/octet-stream`), with the process's
    /// training settings (loss, optimizer, learning rate, batch size, epochs), for devices that train with Core ML.
    case mlmodel

    public var description: String { rawValue }
}

/// Limits of the optional speed test.
public enum SpeedTest {
    /// The largest download or upload a process may ask for: 1 MiB (PyGrid sent 64 MiB to every device).
    public static let maximumBytes = 1 << 20
    /// The bytes moved each way when a process does not say: 256 KiB.
    public static let defaultBytes = 1 << 18
}

/// Media types used on the wire.
public enum MediaType {
    /// Control messages.
    public static let json = "application/json"
    /// Models and diffs.
    public static let safetensors = "application/vnd.safetensors"
}
