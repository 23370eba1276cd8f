import Crypto
import Foundation
import Hummingbird
import HTTPTypes
import NIOCore
import OrchardProtocol

extension CoordinatorServer {
    /// The dashboard's routes: the page, the login link, sign-out, the per-cycle history, and the charts drawn from it.
    /// - Parameters:
    ///   - secureCookie: Whether the session cookie carries `Secure` (served over TLS).
    static func addDashboardRoutes(to router: Router<CoordinatorRequestContext>, coordinator: Coordinator, dashboard: Dashboard?, secureCookie: Bool) {
        router.get(RouterPath(stringLiteral: Endpoint.cycles(":\(Endpoint.Parameter.process)"))) { request, context in
            try requireAdmin(request, from: context.clientAddress, coordinator, dashboard)
            let processID = context.parameters.get(Endpoint.Parameter.process) ?? ""
            return try json(try await coordinator.cycles(processID: processID))  // 404 unknown_process
        }
        // No admin token, no admin API: then no dashboard either.
        guard let dashboard, coordinator.configuration.adminToken != nil else { return }

        router.get(RouterPath(stringLiteral: Endpoint.dashboard)) { request, _ in
            let admitted = coordinator.isAdmin(token: bearer(request)) || dashboard.isValid(session: request.cookies[Dashboard.cookieName]?.value)
            return page(admitted ? DashboardPage.signedIn : DashboardPage.signIn(message: nil), status: .ok)
        }
        router.get(RouterPath(stringLiteral: DashboardPage.chartsPath(":\(Endpoint.Parameter.process)"))) { request, context in
            try requireAdmin(request, from: context.clientAddress, coordinator, dashboard)
            let processID = context.parameters.get(Endpoint.Parameter.process) ?? ""
            let status = try await coordinator.status(processID: processID)  // 404 unknown_process
            // Drawn at the width the page shows them (CSS pixels), within what a phone and a wide screen need.
            let width = request.uri.queryParameters.get("width").flatMap { Double(String($0)) }.map { min(max($0, 280), 1600) } ?? 720
            let evaluations = try await coordinator.evaluations(processID: processID)
            let html = DashboardPage.charts(
                name: status.name, cycles: try await coordinator.cycles(processID: processID).cycles, evaluations: evaluations.evaluations,
                federated: evaluations.federated, width: width.isFinite ? width : 720)
            return page(html, status: .ok)
        }
        router.get(RouterPath(stringLiteral: Endpoint.dashboardLogin)) { request, _ in
            guard let token = request.uri.queryParameters.get("token"), let session = dashboard.redeem(loginToken: String(token)) else {
                return page(DashboardPage.signIn(message: "This login link is unknown, already used or expired. Each link works once."), status: .unauthorized)
            }
            return signedIn(session: session, dashboard: dashboard, secure: secureCookie)
        }
        // The sign-in form: a login token or the admin token itself (in the body, never in a URL).
        router.post(RouterPath(stringLiteral: Endpoint.dashboardLogin)) { request, context in
            var body = try await request.body.collect(upTo: 4096)
            let text = body.readString(length: body.readableBytes) ?? ""
            let token = text.split(separator: "&").lazy.compactMap { pair -> String? in
                let parts = pair.split(separator: "=", maxSplits: 1)
                guard parts.count == 2, parts[0] == "token" else { return nil }
                return String(parts[1]).replacingOccurrences(of: "+", with: " ").removingPercentEncoding
            }.first?.trimmingCharacters(in: .whitespacesAndNewlines)
            guard let token, !token.isEmpty else {
                return page(DashboardPage.signIn(message: "Enter the admin token or a login token."), status: .unauthorized)
            }
            if try coordinator.checkAdmin(token: token, from: context.clientAddress) {
                return signedIn(session: dashboard.startSession(), dashboard: dashboard, secure: secureCookie)
            }
            guard let session = dashboard.redeem(loginToken: token) else {
                return page(DashboardPage.signIn(message: "That token was refused."), status: .unauthorized)
            }
            return signedIn(session: session, dashboard: dashboard, secure: secureCookie)
        }
        router.post(RouterPath(stringLiteral: Endpoint.dashboardLogout)) { request, _ in
            if let session = request.cookies[Dashboard.cookieName]?.value { dashboard.end(session: session) }
            var response = Response(status: .seeOther, headers: [.location: Endpoint.dashboard, .cacheControl: "no-store"])
            response.headers[.setCookie] = sessionCookie("", maxAge: 0, secure: secureCookie)
            return response
        }
    }

    /// 303 to the dashboard, setting the session cookie.
    private static func signedIn(session: String, dashboard: Dashboard, secure: Bool) -> Response {
        var response = Response(
            status: .seeOther, headers: [.location: Endpoint.dashboard, .cacheControl: "no-store", HTTPField.Name("Referrer-Policy")!: "no-referrer"])
        response.headers[.setCookie] = sessionCookie(session, maxAge: dashboard.sessionSeconds, secure: secure)
        return response
    }

    /// The `Set-Cookie` value of a dashboard session: `HttpOnly`, `SameSite=Strict`, `Path=/`, `Secure` over TLS.
    static func sessionCookie(_ value: String, maxAge: Int, secure: Bool) -> String {
        Cookie(name: Dashboard.cookieName, value: value, maxAge: maxAge, path: "/", secure: secure, httpOnly: true, sameSite: .strict).description
    }

    /// An HTML page with a strict content security policy: nothing from elsewhere, only the page's own inline script
    /// (by its hash) and style.
    private static func page(_ html: String, status: HTTPResponse.Status) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = "text/html; charset=utf-8"
        headers[.cacheControl] = "no-store"
        headers[.contentSecurityPolicy] = DashboardPage.contentSecurityPolicy
        headers[.xContentTypeOptions] = "nosniff"
        headers[HTTPField.Name("Referrer-Policy")!] = "no-referrer"
        headers[HTTPField.Name("X-Frame-Options")!] = "DENY"
        return Response(status: status, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(string: html)))
    }
}
