// The dashboard's routes: authentication (bearer token or session cookie), the JSON API as a thin
// adapter over coordinator/queries.h, the embedded pages and the login form.
#include "dashboard/dashboard.h"

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "coordinator/authorization.h"
#include "coordinator/queries.h"
#include "dashboard/assets.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"

namespace zeroshard::dashboard {
namespace {

using http::HttpRequest;
using http::HttpResponse;

constexpr char kBearerPrefix[] = "Bearer ";

// Headers every dashboard answer carries.
void AddCommonHeaders(HttpResponse& response, absl::string_view cache_control) {
  response.headers.emplace_back("Content-Security-Policy", kContentSecurityPolicy);
  response.headers.emplace_back("X-Content-Type-Options", "nosniff");
  // Not no-referrer: with it browsers send `Origin: null` on the login form's POST, which
  // CheckSameOrigin must refuse. Other sites still learn nothing.
  response.headers.emplace_back("Referrer-Policy", "same-origin");
  response.headers.emplace_back("Cache-Control", std::string(cache_control));
}

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(&out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

std::string HtmlEscape(absl::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

HttpResponse JsonError(const absl::Status& status) {
  HttpResponse response{
      Dashboard::HttpStatusOf(status.code()), "application/json",
      absl::StrCat("{\"error\": {\"code\": ", JsonString(absl::StatusCodeToString(status.code())),
                   ", \"message\": ", JsonString(status.message()), "}}\n")};
  AddCommonHeaders(response, "no-store");
  return response;
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("json: ", std::string(status.message())));
  }
  return json;
}

// The same refusal the gRPC service gives a reply past max_send_message_bytes.
absl::Status CheckReplySize(size_t bytes, size_t limit) {
  if (bytes <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("max_send_message_bytes: the reply is ", bytes, " bytes, more than the ", limit,
                   " this coordinator sends; ask for less (filter or page)"));
}

HttpResponse JsonReply(const absl::StatusOr<std::string>& json) {
  if (!json.ok()) return JsonError(json.status());
  HttpResponse response{200, "application/json", *json};
  AddCommonHeaders(response, "no-store");
  return response;
}

// INVALID_ARGUMENT naming a query parameter the endpoint does not take.
absl::Status CheckKnownParameters(const HttpRequest& request,
                                  std::initializer_list<absl::string_view> known) {
  for (const auto& [name, value] : request.query) {
    bool found = false;
    for (absl::string_view candidate : known) found = found || candidate == name;
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": not a query parameter of ", request.path,
          known.size() == 0 ? " (it takes none)"
                            : absl::StrCat(" (it takes ", absl::StrJoin(known, ", "), ")")));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> IntParameter(const HttpRequest& request,
                                                    absl::string_view name) {
  const auto it = request.query.find(std::string(name));
  if (it == request.query.end()) return std::nullopt;
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": '", it->second.substr(0, 32), "' is not an integer"));
  }
  return value;
}

absl::StatusOr<std::optional<int32_t>> Int32Parameter(const HttpRequest& request,
                                                      absl::string_view name) {
  ZS_ASSIGN_OR_RETURN(const std::optional<int64_t> value, IntParameter(request, name));
  if (!value.has_value()) return std::nullopt;
  if (*value < INT32_MIN || *value > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", *value, " is out of range"));
  }
  return static_cast<int32_t>(*value);
}

absl::StatusOr<bool> BoolParameter(const HttpRequest& request, absl::string_view name) {
  const auto it = request.query.find(std::string(name));
  if (it == request.query.end() || it->second == "false") return false;
  if (it->second == "true") return true;
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": '", it->second.substr(0, 32), "' is not true or false"));
}

// An enum query parameter by its value's name ("RUNNING"); unset: the zero value.
template <typename Enum>
absl::StatusOr<Enum> EnumParameter(const HttpRequest& request, absl::string_view name,
                                   bool (*parse)(const std::string&, Enum*)) {
  const auto it = request.query.find(std::string(name));
  Enum value{};
  if (it == request.query.end()) return value;
  if (!parse(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": '", it->second.substr(0, 32), "' is not a state's name"));
  }
  return value;
}

// The query of a list endpoint (/api/v1/workers, /api/v1/jobs) as the gRPC list request: the
// state filter and the page.
template <typename ListRequest, typename State>
absl::StatusOr<ListRequest> ListRequestFromQuery(const HttpRequest& request,
                                                 bool (*parse_state)(const std::string&, State*)) {
  ZS_RETURN_IF_ERROR(CheckKnownParameters(request, {"state", "pageSize", "pageToken"}));
  ListRequest list;
  ZS_ASSIGN_OR_RETURN(const State state, EnumParameter<State>(request, "state", parse_state));
  list.set_state(state);
  ZS_ASSIGN_OR_RETURN(const std::optional<int32_t> page_size, Int32Parameter(request, "pageSize"));
  if (page_size.has_value()) list.set_page_size(*page_size);
  if (auto token = request.query.find("pageToken"); token != request.query.end()) {
    list.set_page_token(token->second);
  }
  return list;
}

// The value of cookie `name` in a Cookie header ("a=1; zeroshard_session=..."), or "".
std::string CookieValue(const HttpRequest& request, absl::string_view name) {
  for (absl::string_view pair : absl::StrSplit(request.Header("cookie"), ';')) {
    pair = absl::StripAsciiWhitespace(pair);
    if (absl::ConsumePrefix(&pair, name) && absl::ConsumePrefix(&pair, "=")) {
      return std::string(pair);
    }
  }
  return "";
}

std::string SessionCookie(absl::string_view value, absl::Duration max_age) {
  return absl::StrCat(kSessionCookie, "=", value, "; HttpOnly; SameSite=Strict; Path=/; Max-Age=",
                      absl::ToInt64Seconds(max_age));
}

HttpResponse LoginPage(int status, absl::string_view message) {
  HttpResponse response{
      status, "text/html; charset=utf-8",
      absl::StrCat(
          "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
          "<title>ZeroShard: log in</title>\n</head>\n<body>\n<main data-page=\"login\">\n"
          "<h1>ZeroShard dashboard</h1>\n",
          message.empty() ? "" : absl::StrCat("<p role=\"alert\">", HtmlEscape(message), "</p>\n"),
          "<form method=\"post\" action=\"/login\">\n<label>Token <input type=\"password\" "
          "name=\"token\" autocomplete=\"current-password\" required></label>\n"
          "<button type=\"submit\">Log in</button>\n</form>\n<p>Any token of the coordinator's "
          "token file with the role viewer, submitter or admin.</p>\n</main>\n</body>\n</html>\n")};
  AddCommonHeaders(response, "no-store");
  return response;
}

HttpResponse Redirect(absl::string_view location) {
  HttpResponse response{303, "text/plain", absl::StrCat("see ", location, "\n")};
  response.headers.emplace_back("Location", std::string(location));
  AddCommonHeaders(response, "no-store");
  return response;
}

// The host:port of an Origin ("http://host:port") or a Referer ("http://host:port/path?query"),
// parsed; an error for anything else ("null", another scheme).
absl::StatusOr<http::HostAndPort> AuthorityOf(absl::string_view url, bool origin) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "http://") && !absl::ConsumePrefix(&rest, "https://")) {
    return absl::InvalidArgumentError("not an http or https URL");
  }
  const size_t end = rest.find_first_of("/?#");
  if (origin && end != absl::string_view::npos) {
    return absl::InvalidArgumentError("an origin has no path");
  }
  return http::ParseHostAndPort(rest.substr(0, end));
}

// A POST must say which page sent it, and that page must be on this host: its Origin header,
// or without one its Referer, names the request's own Host (which the HTTP server has checked
// against --http_allowed_hosts). This refuses cross-site POSTs in browsers that ignore the
// cookie's SameSite=Strict and requests that hide where they come from. The dashboard's
// Referrer-Policy (same-origin) keeps browsers sending both for its own pages.
absl::Status CheckSameOrigin(const HttpRequest& request) {
  const std::string origin = request.Header("origin");
  const std::string referer = request.Header("referer");
  const bool by_origin = !origin.empty();
  const std::string& source = by_origin ? origin : referer;
  if (source.empty()) {
    return absl::PermissionDeniedError(
        "origin: a POST must carry an Origin or Referer header naming this host (browsers send "
        "them; a script sends `Origin: http://<the Host it connects to>`)");
  }
  const absl::string_view header = by_origin ? "origin" : "referer";
  absl::StatusOr<http::HostAndPort> from = AuthorityOf(source, by_origin);
  absl::StatusOr<http::HostAndPort> host = http::ParseHostAndPort(request.Header("host"));
  if (!from.ok() || !host.ok() || !(*from == *host)) {
    return absl::PermissionDeniedError(absl::StrCat(
        header, ": refused from another origin (the ", header,
        " header must name this page's own host and port, http://", request.Header("host"), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

Dashboard::Dashboard(DashboardOptions options)
    : options_(std::move(options)), sessions_(options_.clock, options_.sessions) {}

int Dashboard::HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kFailedPrecondition:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

std::vector<http::HttpRoute> Dashboard::Routes() {
  auto page = [this](const HttpRequest& request) { return Page(request); };
  auto api = [this](const HttpRequest& request) { return Api(request); };
  return {
      {"/", /*prefix=*/false, {"GET"}, page},
      {"/static/", /*prefix=*/true, {"GET"}, page},
      {"/login",
       /*prefix=*/false,
       {"GET", "POST"},
       [this](const HttpRequest& request) { return Login(request); }},
      {"/logout",
       /*prefix=*/false,
       {"POST"},
       [this](const HttpRequest& request) { return Logout(request); }},
      {"/api/", /*prefix=*/true, {"GET"}, api},
  };
}

absl::StatusOr<security::Identity> Dashboard::Caller(const HttpRequest& request) {
  if (!options_.authenticator->enabled()) {
    return security::Identity{"anonymous", security::Role::kAdmin};
  }
  const std::string authorization = request.Header("authorization");
  if (!authorization.empty()) {
    absl::string_view token = authorization;
    if (!absl::ConsumePrefix(&token, kBearerPrefix)) {
      return absl::UnauthenticatedError(
          "authorization: expected 'Bearer <token>' (the token is never quoted)");
    }
    return options_.authenticator->AuthenticateToken(token);
  }
  const std::string session = CookieValue(request, kSessionCookie);
  if (!session.empty()) {
    std::string credential;
    std::optional<security::Identity> identity = sessions_.Find(session, &credential);
    if (!identity.has_value()) {
      return absl::UnauthenticatedError(
          "session: unknown or expired (sessions end after their lifetime, at logout, when their "
          "token is revoked and when the coordinator restarts); log in again at /login");
    }
    // A reload ends the sessions of revoked tokens; this covers a login racing with it.
    if (options_.authenticator->Revoked(credential, *identity)) {
      sessions_.Remove(session);
      return absl::UnauthenticatedError(
          "session: token revoked (the token that logged in left the coordinator's token file); "
          "log in again at /login");
    }
    return *std::move(identity);
  }
  return absl::UnauthenticatedError(
      "no credentials: send 'Authorization: Bearer <token>' or log in at /login");
}

HttpResponse Dashboard::Page(const HttpRequest& request) {
  absl::StatusOr<security::Identity> caller = Caller(request);
  if (!caller.ok()) return LoginPage(401, "");
  if (absl::Status allowed = coordinator::Authorize(*caller, coordinator::Method::kListJobs);
      !allowed.ok()) {
    return LoginPage(403, allowed.message());
  }
  absl::string_view name = request.path;
  if (name == "/") {
    name = "index.html";
  } else {
    absl::ConsumePrefix(&name, "/static/");
  }
  const Asset* asset = FindAsset(name);
  if (asset == nullptr) {
    HttpResponse missing{404, "text/plain", absl::StrCat("not found: ", request.path, "\n")};
    AddCommonHeaders(missing, "no-store");
    return missing;
  }
  HttpResponse response{200, std::string(asset->content_type), std::string(asset->bytes)};
  // Embedded in this binary: revalidated each load, so a new coordinator's pages are used.
  AddCommonHeaders(response, "no-cache");
  return response;
}

HttpResponse Dashboard::Login(const HttpRequest& request) {
  if (request.method != "POST") {
    if (!options_.authenticator->enabled()) return Redirect("/");
    return LoginPage(200, "");
  }
  if (absl::Status same = CheckSameOrigin(request); !same.ok()) {
    return LoginPage(403, absl::StrCat("login: ", same.message()));
  }
  if (!options_.authenticator->enabled()) return Redirect("/");
  absl::StatusOr<std::map<std::string, std::string>> form = http::ParseFormBody(request.body);
  if (!form.ok()) return LoginPage(400, form.status().message());
  const auto token = form->find("token");
  if (token == form->end() || token->second.empty()) {
    return LoginPage(400, "token: required (the form field `token`)");
  }
  std::string credential;
  absl::StatusOr<security::Identity> identity =
      options_.authenticator->AuthenticateToken(token->second, &credential);
  if (!identity.ok()) return LoginPage(401, "token: not accepted by this coordinator");
  if (absl::Status allowed = coordinator::Authorize(*identity, coordinator::Method::kListJobs);
      !allowed.ok()) {
    return LoginPage(403, allowed.message());
  }
  HttpResponse response = Redirect("/");
  response.headers.emplace_back("Set-Cookie",
                                SessionCookie(sessions_.Create(*identity, std::move(credential)),
                                              sessions_.options().lifetime));
  return response;
}

HttpResponse Dashboard::Logout(const HttpRequest& request) {
  if (absl::Status same = CheckSameOrigin(request); !same.ok()) {
    return LoginPage(403, absl::StrCat("logout: ", same.message()));
  }
  const std::string session = CookieValue(request, kSessionCookie);
  if (!session.empty()) sessions_.Remove(session);
  HttpResponse response = Redirect("/login");
  response.headers.emplace_back("Set-Cookie", SessionCookie("", absl::ZeroDuration()));
  return response;
}

HttpResponse Dashboard::Api(const HttpRequest& request) {
  absl::StatusOr<security::Identity> caller = Caller(request);
  if (!caller.ok()) return JsonError(caller.status());
  coordinator::JobManager& manager = *options_.manager;
  const size_t limit = options_.max_reply_bytes;
  auto authorize = [&](coordinator::Method method) {
    return coordinator::Authorize(*caller, method);
  };
  // Runs one endpoint's steps; the first error becomes the JSON error.
  auto answer = [](auto&& run) -> HttpResponse { return JsonReply(run()); };

  if (request.path == "/api/v1/workers") {
    return answer([&]() -> absl::StatusOr<std::string> {
      ZS_RETURN_IF_ERROR(authorize(coordinator::Method::kListWorkers));
      ZS_ASSIGN_OR_RETURN(const v1::ListWorkersRequest list,
                          (ListRequestFromQuery<v1::ListWorkersRequest, v1::WorkerState>(
                              request, &v1::WorkerState_Parse)));
      ZS_ASSIGN_OR_RETURN(const v1::ListWorkersResponse response,
                          coordinator::ListWorkers(manager, list));
      ZS_RETURN_IF_ERROR(CheckReplySize(response.ByteSizeLong(), limit));
      return ToJson(response);
    });
  }
  if (request.path == "/api/v1/jobs") {
    return answer([&]() -> absl::StatusOr<std::string> {
      ZS_RETURN_IF_ERROR(authorize(coordinator::Method::kListJobs));
      ZS_ASSIGN_OR_RETURN(
          const v1::ListJobsRequest list,
          (ListRequestFromQuery<v1::ListJobsRequest, v1::JobState>(request, &v1::JobState_Parse)));
      ZS_ASSIGN_OR_RETURN(const v1::ListJobsResponse response,
                          coordinator::ListJobs(manager, list));
      ZS_RETURN_IF_ERROR(CheckReplySize(response.ByteSizeLong(), limit));
      return ToJson(response);
    });
  }
  absl::string_view rest = request.path;
  if (!absl::ConsumePrefix(&rest, "/api/v1/jobs/") || rest.empty()) {
    return JsonError(absl::NotFoundError(absl::StrCat("no API endpoint at ", request.path)));
  }
  const std::vector<std::string> parts = absl::StrSplit(rest, '/');
  const std::string& job_id = parts[0];
  if (parts.size() == 1) {
    return answer([&]() -> absl::StatusOr<std::string> {
      ZS_RETURN_IF_ERROR(authorize(coordinator::Method::kGetJob));
      ZS_RETURN_IF_ERROR(CheckKnownParameters(request, {}));
      v1::GetJobRequest get;
      get.set_job_id(job_id);
      ZS_ASSIGN_OR_RETURN(const v1::Job job, coordinator::GetJob(manager, get, /*caller=*/""));
      ZS_RETURN_IF_ERROR(CheckReplySize(job.ByteSizeLong(), limit));
      return ToJson(job);
    });
  }
  if (parts.size() == 2 && parts[1] == "events") {
    return answer([&]() -> absl::StatusOr<std::string> {
      ZS_RETURN_IF_ERROR(authorize(coordinator::Method::kWatchJob));
      ZS_RETURN_IF_ERROR(CheckKnownParameters(request, {"afterSequence", "limit"}));
      ZS_ASSIGN_OR_RETURN(const std::optional<int64_t> after,
                          IntParameter(request, "afterSequence"));
      ZS_ASSIGN_OR_RETURN(const std::optional<int64_t> max_events, IntParameter(request, "limit"));
      ZS_ASSIGN_OR_RETURN(
          const std::vector<v1::JobEvent> events,
          coordinator::ListJobEvents(manager, job_id, after.value_or(0),
                                     max_events.value_or(coordinator::kDefaultJobEventsPage)));
      size_t bytes = 0;
      std::vector<std::string> printed;
      printed.reserve(events.size());
      for (const v1::JobEvent& event : events) {
        bytes += event.ByteSizeLong();
        ZS_RETURN_IF_ERROR(CheckReplySize(bytes, limit));
        ZS_ASSIGN_OR_RETURN(std::string json, ToJson(event));
        printed.push_back(std::move(json));
      }
      return absl::StrCat("{\"events\":[", absl::StrJoin(printed, ","), "]}");
    });
  }
  if (parts.size() == 2 && parts[1] == "plan") {
    return answer([&]() -> absl::StatusOr<std::string> {
      ZS_RETURN_IF_ERROR(authorize(coordinator::Method::kGetShardPlan));
      ZS_RETURN_IF_ERROR(CheckKnownParameters(request, {"generation", "rank", "includeLayout"}));
      v1::GetShardPlanRequest get;
      get.set_job_id(job_id);
      ZS_ASSIGN_OR_RETURN(const std::optional<int64_t> generation,
                          IntParameter(request, "generation"));
      get.set_generation(generation.value_or(0));
      ZS_ASSIGN_OR_RETURN(const std::optional<int32_t> rank, Int32Parameter(request, "rank"));
      get.set_rank(rank.value_or(0));
      ZS_ASSIGN_OR_RETURN(const bool include_layout, BoolParameter(request, "includeLayout"));
      get.set_include_layout(include_layout);
      ZS_ASSIGN_OR_RETURN(const v1::ShardPlan plan, coordinator::GetShardPlan(manager, get));
      ZS_RETURN_IF_ERROR(CheckReplySize(plan.ByteSizeLong(), limit));
      return ToJson(plan);
    });
  }
  return JsonError(absl::NotFoundError(absl::StrCat("no API endpoint at ", request.path)));
}

}  // namespace zeroshard::dashboard
