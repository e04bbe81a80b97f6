// The dashboard on the coordinator's HTTP port: the pages (dashboard/static/, embedded), the JSON
// API (/api/v1/..., proto3 JSON of the gRPC API's answers) and, with a token file, the login
// form and its session cookie. docs/api.md, "HTTP API and dashboard", is its reference.
#ifndef ZEROSHARD_DASHBOARD_DASHBOARD_H_
#define ZEROSHARD_DASHBOARD_DASHBOARD_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "coordinator/job_manager.h"
#include "dashboard/sessions.h"
#include "http/http_server.h"
#include "security/authenticator.h"
#include "security/identity.h"

namespace zeroshard::dashboard {

inline constexpr char kSessionCookie[] = "zeroshard_session";
// Only same-origin scripts, styles, images and fetches; no frames, no inline code.
inline constexpr char kContentSecurityPolicy[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

struct DashboardOptions {
  // Not owned; outlive the dashboard.
  coordinator::JobManager* manager = nullptr;
  const security::Authenticator* authenticator = nullptr;
  common::Clock* clock = common::Clock::Real();
  SessionOptions sessions;
  // Largest answer, by its message's encoded size as gRPC would send it (the gRPC service's
  // max_send_message_bytes): a bigger one is 429 RESOURCE_EXHAUSTED naming the limit.
  size_t max_reply_bytes = 4 << 20;
};

// Thread contract: the routes' handlers run on the HTTP server's one thread, each quick (the
// manager's calls take its lock briefly, as the gRPC service's do); the Dashboard must outlive
// the server they are registered with. Sessions are thread-safe on their own.
class Dashboard {
 public:
  explicit Dashboard(DashboardOptions options);

  // Routes for http::HttpServerOptions::routes: /, /static/, /login, /logout and /api/.
  std::vector<http::HttpRoute> Routes();

  // The HTTP status for a gRPC-style code: 400, 401, 403, 404, 409 (FAILED_PRECONDITION), 429,
  // 503 (UNAVAILABLE), else 500.
  static int HttpStatusOf(absl::StatusCode code);

  SessionStore& sessions() { return sessions_; }

 private:
  // The caller of `request`: anyone (an admin named "anonymous") without authentication, else
  // the bearer token's or the session cookie's identity; UNAUTHENTICATED otherwise.
  absl::StatusOr<security::Identity> Caller(const http::HttpRequest& request);

  http::HttpResponse Page(const http::HttpRequest& request);
  http::HttpResponse Login(const http::HttpRequest& request);
  http::HttpResponse Logout(const http::HttpRequest& request);
  http::HttpResponse Api(const http::HttpRequest& request);

  DashboardOptions options_;
  SessionStore sessions_;
};

}  // namespace zeroshard::dashboard

#endif  // ZEROSHARD_DASHBOARD_DASHBOARD_H_
