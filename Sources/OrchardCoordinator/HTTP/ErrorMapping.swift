import Foundation
public import Hummingbird
import HTTPTypes
import Logging
import NIOCore
import NIOHTTP1
public import OrchardProtocol

extension CoordinatorError {
    /// The HTTP status of the error's code: the one place a domain error becomes a status.
    public var httpStatus: Int { Self.status(of: code) }

    /// The HTTP status a wire error code is sent with (500 for a code of the coordinator's own failures).
    public static func status(of code: WireErrorCode) -> Int {
        switch code {
        case .malformedJSON, .malformedSafetensors, .invalidRequest, .invalidConfiguration, .unsupportedVersion: 400
        case .unauthorized: 401
        case .forbidden, .sessionProcessMismatch, .invalidRequestKey, .workerLimitReached: 403
        case .unknownWorker, .unknownProcess, .unknownCheckpoint, .notFound: 404
        case .methodNotAllowed: 405
        case .reportAlreadyReceived, .deadlinePassed, .reportTooStale, .evaluationAlreadyReceived, .evaluationClosed, .processExists, .aggregationModeMismatch,
            .stageClosed,
            .droppedDevice, .duplicateMessage:
            409
        case .payloadTooLarge: 413
        case .rangeNotSatisfiable: 416
        case .rateLimited: 429
        case .tensorMismatch, .shapeMismatch, .dtypeMismatch, .nonFiniteValues, .frozenTensorChanged, .invalidSampleCount, .updateNormExceeded,
            .invalidSecureAggregationMessage, .unsupportedFormat:
            422
        case .tooManyUploads, .bufferReleasing: 503
        default: 500
        }
    }
}

extension CoordinatorError: HTTPResponseError {
    /// The status of the error's code.
    public var status: HTTPResponse.Status { HTTPResponse.Status(code: httpStatus) }

    /// `{"error":{"code","message"}}` with the code's status (and `Content-Range: bytes */*` on a 416, `Retry-After`
    /// in whole seconds when the error says when to ask again).
    public func response(from request: Request, context: some RequestContext) throws -> Response {
        var response = try CoordinatorServer.json(body, status: status)
        if code == .rangeNotSatisfiable { response.headers[.contentRange] = "bytes */*" }
        if let retryAfter, retryAfter.isFinite { response.headers[.retryAfter] = "\(Int(max(1, retryAfter.rounded(.up))))" }
        return response
    }
}

/// Turns every error into `{"error":{"code","message"}}`: coordinator errors with their code's status,
/// Hummingbird's (e.g. no route) with their own status, anything else as a logged 500.
struct ErrorMiddleware<Context: RequestContext>: RouterMiddleware {
    let logger: Logger

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let error as CoordinatorError {
            return (try? error.response(from: request, context: context)) ?? Response(status: .internalServerError)
        } catch let error as HTTPError {
            // Hummingbird's own refusals keep their status; the code names the nearest wire code.
            let code: WireErrorCode =
                switch error.status.code {
                case 404: .notFound
                case 405: .methodNotAllowed
                case 413: .payloadTooLarge
                case 400: .invalidRequest
                default: .internalError
                }
            let body = ErrorBody(code: code, message: error.body ?? error.status.reasonPhrase)
            return (try? CoordinatorServer.json(body, status: error.status)) ?? Response(status: error.status)
        } catch {
            if Self.isClientDisconnect(error) {
                // Nothing was kept of the request (an upload is abandoned and its resend accepted), and nobody is
                // there to read an answer: what happened, not a failure of the coordinator.
                logger.info("the client went away before its request was complete", metadata: ["path": "\(request.uri.path)"])
                let body = ErrorBody(code: .invalidRequest, message: "the request ended before its body was complete")
                return (try? CoordinatorServer.json(body, status: .badRequest)) ?? Response(status: .badRequest)
            }
            logger.error("unhandled error", metadata: ["path": "\(request.uri.path)", "error": "\(error)"])
            return (try? CoordinatorError.internalError("unexpected failure").response(from: request, context: context))
                ?? Response(status: .internalServerError)
        }
    }

    /// Whether `error` is the client closing its connection in the middle of a request (NIO's HTTP parser meets the end
    /// of the stream before the body's end).
    static func isClientDisconnect(_ error: any Error) -> Bool {
        if let parser = error as? HTTPParserError, parser == .invalidEOFState { return true }
        if let channel = error as? ChannelError, channel == .ioOnClosedChannel || channel == .eof || channel == .outputClosed { return true }
        return false
    }
}
