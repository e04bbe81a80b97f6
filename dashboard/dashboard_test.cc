// The dashboard on a real coordinator over loopback: each JSON endpoint against the gRPC answer
// to the same request, paging, errors, the pages and their headers, and with a token file the
// bearer token, the login form's session cookie, logout and refused credentials.
#include "dashboard/dashboard.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "apps/coordinator/coordinator_server.h"
#include "common/clock.h"
#include "coordinator/test_rpc_support.h"
#include "dashboard/assets.h"
#include "dashboard/sessions.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "http/http_test_client.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::dashboard {
namespace {

using coordinator::CoordinatorServer;
using coordinator::CoordinatorServerOptions;
using coordinator::SetDeadline;

constexpr char kViewerToken[] = "viewer-token-0123456789";
constexpr char kWorkerToken[] = "worker-token-0123456789";
constexpr char kAdminToken[] = "admin-token-0123456789";
// What a browser sends with a POST from the dashboard's own pages (Fetch's Host is 127.0.0.1).
constexpr char kSameOrigin[] = "Origin: http://127.0.0.1";
constexpr char kFormType[] = "Content-Type: application/x-www-form-urlencoded";

// An answer with its raw headers (Set-Cookie, Location, Content-Security-Policy...).
struct Answer {
  int status = 0;
  std::string content_type;
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
};

Answer Fetch(int port, const std::string& method, const std::string& target,
             const std::vector<std::string>& headers = {}, const std::string& body = "") {
  Answer answer;
  absl::StatusOr<http::testing::RawConnection> connection =
      http::testing::RawConnection::Open(port);
  EXPECT_TRUE(connection.ok()) << connection.status();
  if (!connection.ok()) return answer;
  // Host: 127.0.0.1 unless `headers` name another.
  bool has_host = false;
  for (const std::string& header : headers) {
    has_host = has_host || absl::StartsWithIgnoreCase(header, "host:");
  }
  std::string request =
      absl::StrCat(method, " ", target, " HTTP/1.1\r\n", has_host ? "" : "Host: 127.0.0.1\r\n",
                   "Connection: close\r\n");
  for (const std::string& header : headers) absl::StrAppend(&request, header, "\r\n");
  if (!body.empty()) absl::StrAppend(&request, "Content-Length: ", body.size(), "\r\n");
  absl::StrAppend(&request, "\r\n", body);
  EXPECT_TRUE(connection->Send(request).ok());
  absl::StatusOr<std::string> raw = connection->ReadUntilClosed(absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(raw.ok()) << raw.status();
  if (!raw.ok()) return answer;
  absl::StatusOr<http::testing::HttpReply> reply = http::testing::ParseReply(*raw);
  EXPECT_TRUE(reply.ok()) << reply.status();
  if (!reply.ok()) return answer;
  answer.status = reply->status;
  answer.content_type = reply->content_type;
  answer.body = reply->body;
  const std::vector<std::string> lines =
      absl::StrSplit(raw->substr(0, raw->find("\r\n\r\n")), "\r\n");
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    std::string name = lines[i].substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    answer.headers[name] = std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  return answer;
}

template <typename Message>
Message FromJson(const std::string& json) {
  Message message;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &message);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return message;
}

template <typename Message>
void ExpectSameMessage(const Message& from_http, const Message& from_grpc) {
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(from_http, from_grpc))
      << "HTTP:\n"
      << from_http.DebugString() << "gRPC:\n"
      << from_grpc.DebugString();
}

// The error body's code and message.
std::pair<std::string, std::string> ErrorOf(const Answer& answer) {
  google::protobuf::Struct error = FromJson<google::protobuf::Struct>(answer.body);
  const auto& fields = error.fields().at("error").struct_value().fields();
  return {fields.at("code").string_value(), fields.at("message").string_value()};
}

class DashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  void StartServer(bool with_tokens, bool dashboard = true,
                   std::vector<std::string> http_allowed_hosts = {}) {
    CoordinatorServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_port = 0;
    options.dashboard = dashboard;
    options.state_dir = dir_ + "/state";
    options.http_allowed_hosts = std::move(http_allowed_hosts);
    if (with_tokens) {
      options.token_file = dir_ + "/tokens.txt";
      WriteTokens(absl::StrCat(kViewerToken, " viewer vera\n", kWorkerToken, " worker node\n",
                               kAdminToken, " admin ada\n"));
    }
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(options, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    port_ = server_->metrics_port();
    channel_ = grpc::CreateChannel(server_->grpc_target(), grpc::InsecureChannelCredentials());
    stub_ = v1::Coordinator::NewStub(channel_);
  }

  // Without a token file: two workers, three jobs (one running with progress from both ranks).
  v1::Job RunningJobWithProgress() {
    for (const char* name : {"a", "b"}) {
      v1::RegisterWorkerRequest request;
      request.set_name(name);
      request.set_host(absl::StrCat("host-", name));
      request.set_device_kind(v1::CPU);
      v1::RegisterWorkerResponse response;
      grpc::ClientContext context;
      SetDeadline(context);
      EXPECT_TRUE(stub_->RegisterWorker(&context, request, &response).ok());
    }
    v1::Job running;
    for (int i = 0; i < 3; ++i) {
      v1::SubmitJobRequest request;
      *request.mutable_spec() = coordinator::Spec(absl::StrCat("job", i), 2);
      v1::Job job;
      grpc::ClientContext context;
      SetDeadline(context);
      EXPECT_TRUE(stub_->SubmitJob(&context, request, &job).ok());
      if (i == 0) running = job;
    }
    running = GetJob(running.id());
    EXPECT_EQ(running.state(), v1::RUNNING);
    for (const auto& [rank, step] : std::vector<std::pair<int, int64_t>>{{0, 1}, {1, 1}, {0, 2}}) {
      v1::ReportProgressRequest request;
      request.set_worker_id(running.worker_ids(rank));
      request.set_job_id(running.id());
      request.set_generation(running.generation());
      request.set_rank(rank);
      *request.mutable_metrics() = coordinator::Metrics(step);
      request.mutable_metrics()->mutable_memory()->set_optimizer_state_bytes(1000 + rank);
      v1::ReportProgressResponse response;
      grpc::ClientContext context;
      SetDeadline(context);
      EXPECT_TRUE(stub_->ReportProgress(&context, request, &response).ok());
    }
    return GetJob(running.id());
  }

  // Replaces the token file whole (rename), as an operator's editor would.
  void WriteTokens(const std::string& text) {
    const std::string path = dir_ + "/tokens.txt";
    std::FILE* f = std::fopen((path + ".tmp").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    ASSERT_EQ(std::fclose(f), 0);
    std::filesystem::rename(path + ".tmp", path);
  }

  // Logs in with `token` from the dashboard's own origin; returns the Cookie header to send.
  std::string LogIn(const std::string& token) {
    Answer login =
        Fetch(port_, "POST", "/login", {kFormType, kSameOrigin}, absl::StrCat("token=", token));
    EXPECT_EQ(login.status, 303) << login.body;
    return absl::StrCat(
        "Cookie: ", std::vector<std::string>(absl::StrSplit(login.headers["set-cookie"], ';'))[0]);
  }

  v1::Job GetJob(const std::string& id) {
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::Job job;
    grpc::ClientContext context;
    SetDeadline(context);
    EXPECT_TRUE(stub_->GetJob(&context, request, &job).ok());
    return job;
  }

  v1::ListJobsResponse ListJobs(const v1::ListJobsRequest& request) {
    v1::ListJobsResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    EXPECT_TRUE(stub_->ListJobs(&context, request, &response).ok());
    return response;
  }

  // The first `count` events WatchJob sends after `after_sequence`.
  std::vector<v1::JobEvent> WatchEvents(const std::string& job_id, int64_t after_sequence,
                                        size_t count) {
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_after_sequence(after_sequence);
    grpc::ClientContext context;
    SetDeadline(context);
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, request);
    std::vector<v1::JobEvent> events;
    v1::JobEvent event;
    while (events.size() < count && reader->Read(&event)) events.push_back(event);
    context.TryCancel();
    reader->Finish();
    return events;
  }

  std::string dir_;
  common::FakeClock clock_;
  std::unique_ptr<CoordinatorServer> server_;
  int port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(DashboardTest, EachEndpointAnswersWhatGrpcAnswers) {
  StartServer(/*with_tokens=*/false);
  const v1::Job running = RunningJobWithProgress();

  Answer workers = Fetch(port_, "GET", "/api/v1/workers");
  ASSERT_EQ(workers.status, 200) << workers.body;
  EXPECT_EQ(workers.content_type, "application/json");
  v1::ListWorkersResponse grpc_workers;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(stub_->ListWorkers(&context, v1::ListWorkersRequest(), &grpc_workers).ok());
  }
  ExpectSameMessage(FromJson<v1::ListWorkersResponse>(workers.body), grpc_workers);
  EXPECT_EQ(grpc_workers.workers_size(), 2);
  // Proto3 JSON with every field printed: int64 as strings, enums by name.
  EXPECT_TRUE(absl::StrContains(workers.body, "\"state\": \"BUSY\"") ||
              absl::StrContains(workers.body, "\"state\":\"BUSY\""))
      << workers.body;

  // Paging: one job a page, following nextPageToken, as gRPC pages.
  v1::ListJobsRequest page_request;
  page_request.set_page_size(1);
  std::string target = "/api/v1/jobs?pageSize=1";
  int pages = 0;
  while (true) {
    Answer page = Fetch(port_, "GET", target);
    ASSERT_EQ(page.status, 200) << page.body;
    const v1::ListJobsResponse grpc_page = ListJobs(page_request);
    const v1::ListJobsResponse http_page = FromJson<v1::ListJobsResponse>(page.body);
    ExpectSameMessage(http_page, grpc_page);
    ASSERT_EQ(http_page.jobs_size(), 1);
    ++pages;
    if (http_page.next_page_token().empty()) break;
    page_request.set_page_token(http_page.next_page_token());
    target = absl::StrCat("/api/v1/jobs?pageSize=1&pageToken=", http_page.next_page_token());
  }
  EXPECT_EQ(pages, 3);
  v1::ListJobsRequest running_only;
  running_only.set_state(v1::RUNNING);
  Answer filtered = Fetch(port_, "GET", "/api/v1/jobs?state=RUNNING");
  ASSERT_EQ(filtered.status, 200) << filtered.body;
  ExpectSameMessage(FromJson<v1::ListJobsResponse>(filtered.body), ListJobs(running_only));
  EXPECT_EQ(FromJson<v1::ListJobsResponse>(filtered.body).jobs_size(), 1);

  Answer job = Fetch(port_, "GET", "/api/v1/jobs/" + running.id());
  ASSERT_EQ(job.status, 200) << job.body;
  const v1::Job http_job = FromJson<v1::Job>(job.body);
  ExpectSameMessage(http_job, running);
  ASSERT_EQ(http_job.rank_progress_size(), 2);
  EXPECT_EQ(http_job.rank_progress(0).step(), 2);
  EXPECT_EQ(http_job.rank_progress(1).step(), 1);
  EXPECT_EQ(http_job.rank_progress(1).memory().optimizer_state_bytes(), 1001);
  EXPECT_TRUE(absl::StrContains(job.body, "\"rankProgress\"")) << job.body;

  // Events: all of them, then a page after a sequence with a limit.
  Answer all_events = Fetch(port_, "GET", "/api/v1/jobs/" + running.id() + "/events");
  ASSERT_EQ(all_events.status, 200) << all_events.body;
  google::protobuf::Struct all = FromJson<google::protobuf::Struct>(all_events.body);
  const int total = all.fields().at("events").list_value().values_size();
  ASSERT_GE(total, 4);
  Answer some_events =
      Fetch(port_, "GET", "/api/v1/jobs/" + running.id() + "/events?afterSequence=1&limit=2");
  ASSERT_EQ(some_events.status, 200) << some_events.body;
  google::protobuf::Struct some = FromJson<google::protobuf::Struct>(some_events.body);
  const auto& listed = some.fields().at("events").list_value();
  ASSERT_EQ(listed.values_size(), 2);
  const std::vector<v1::JobEvent> watched = WatchEvents(running.id(), 1, 2);
  ASSERT_EQ(watched.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    std::string json;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(listed.values(i), &json).ok());
    const v1::JobEvent event = FromJson<v1::JobEvent>(json);
    ExpectSameMessage(event, watched[i]);
    EXPECT_EQ(event.sequence(), 2 + i);
  }

  v1::GetShardPlanRequest plan_request;
  plan_request.set_job_id(running.id());
  plan_request.set_rank(1);
  plan_request.set_include_layout(true);
  v1::ShardPlan grpc_plan;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(stub_->GetShardPlan(&context, plan_request, &grpc_plan).ok());
  }
  Answer plan =
      Fetch(port_, "GET", "/api/v1/jobs/" + running.id() + "/plan?rank=1&includeLayout=true");
  ASSERT_EQ(plan.status, 200) << plan.body;
  ExpectSameMessage(FromJson<v1::ShardPlan>(plan.body), grpc_plan);
  EXPECT_GT(grpc_plan.buckets_size(), 0);
}

TEST_F(DashboardTest, ErrorsNameTheJobOrTheParameter) {
  StartServer(/*with_tokens=*/false);
  const v1::Job running = RunningJobWithProgress();

  Answer unknown = Fetch(port_, "GET", "/api/v1/jobs/job-000999");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.content_type, "application/json");
  EXPECT_EQ(ErrorOf(unknown).first, "NOT_FOUND");
  EXPECT_TRUE(absl::StrContains(ErrorOf(unknown).second, "job-000999")) << unknown.body;
  Answer unknown_events = Fetch(port_, "GET", "/api/v1/jobs/job-000999/events");
  EXPECT_EQ(unknown_events.status, 404);
  EXPECT_TRUE(absl::StrContains(ErrorOf(unknown_events).second, "job-000999"));

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"/api/v1/jobs?pageSize=many", "pageSize"},
      {"/api/v1/jobs?pageSize=0", "page_size"},
      {"/api/v1/jobs?state=SOMETIMES", "state"},
      {"/api/v1/workers?colour=red", "colour"},
      {"/api/v1/jobs/" + running.id() + "/events?limit=0", "limit"},
      {"/api/v1/jobs/" + running.id() + "/events?limit=10001", "limit"},
      {"/api/v1/jobs/" + running.id() + "/events?afterSequence=-1", "after_sequence"},
      {"/api/v1/jobs/" + running.id() + "/plan?rank=x", "rank"},
      {"/api/v1/jobs/" + running.id() + "/plan?includeLayout=maybe", "includeLayout"},
      {"/api/v1/jobs/bad%20id", "job_id"},
  };
  for (const auto& [target, named] : bad) {
    Answer answer = Fetch(port_, "GET", target);
    EXPECT_EQ(answer.status, 400) << target << ": " << answer.body;
    EXPECT_EQ(ErrorOf(answer).first, "INVALID_ARGUMENT") << target;
    EXPECT_TRUE(absl::StartsWith(ErrorOf(answer).second, named))
        << target << ": " << ErrorOf(answer).second;
  }
  Answer nowhere = Fetch(port_, "GET", "/api/v1/jobs/" + running.id() + "/nothing");
  EXPECT_EQ(nowhere.status, 404);
  EXPECT_EQ(Fetch(port_, "POST", "/api/v1/jobs").status, 405);
}

TEST_F(DashboardTest, PagesAreServedWithTheirTypeAndPolicy) {
  StartServer(/*with_tokens=*/false);
  Answer index = Fetch(port_, "GET", "/");
  ASSERT_EQ(index.status, 200);
  EXPECT_EQ(index.content_type, "text/html; charset=utf-8");
  EXPECT_EQ(index.body, std::string(FindAsset("index.html")->bytes));
  EXPECT_EQ(index.headers.at("content-security-policy"), kContentSecurityPolicy);
  EXPECT_TRUE(absl::StrContains(index.headers.at("content-security-policy"), "script-src 'self'"));
  EXPECT_EQ(index.headers.at("x-content-type-options"), "nosniff");
  for (const Asset& asset : Assets()) {
    Answer file = Fetch(port_, "GET", absl::StrCat("/static/", asset.name));
    EXPECT_EQ(file.status, 200) << asset.name;
    EXPECT_EQ(file.content_type, asset.content_type) << asset.name;
    EXPECT_EQ(file.body, std::string(asset.bytes)) << asset.name;
    EXPECT_EQ(file.headers["content-security-policy"], kContentSecurityPolicy) << asset.name;
  }
  EXPECT_EQ(Fetch(port_, "GET", "/static/no-such-file.js").status, 404);
  // Without a token file there is nothing to log in to.
  Answer login = Fetch(port_, "GET", "/login");
  EXPECT_EQ(login.status, 303);
  EXPECT_EQ(login.headers["location"], "/");
  EXPECT_EQ(Fetch(port_, "GET", "/healthz").status, 200);
  EXPECT_EQ(Fetch(port_, "GET", "/metrics").status, 200);
}

TEST_F(DashboardTest, WithoutTheDashboardNeitherPagesNorApiAreServed) {
  StartServer(/*with_tokens=*/false, /*dashboard=*/false);
  EXPECT_EQ(Fetch(port_, "GET", "/").status, 404);
  EXPECT_EQ(Fetch(port_, "GET", "/static/index.html").status, 404);
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs").status, 404);
  EXPECT_EQ(Fetch(port_, "GET", "/login").status, 404);
  EXPECT_EQ(Fetch(port_, "GET", "/metrics").status, 200);
  EXPECT_EQ(Fetch(port_, "GET", "/healthz").status, 200);
}

TEST_F(DashboardTest, WithTokensCallersNeedAViewerTokenOrASession) {
  StartServer(/*with_tokens=*/true);
  Answer anonymous = Fetch(port_, "GET", "/api/v1/jobs");
  EXPECT_EQ(anonymous.status, 401);
  EXPECT_EQ(ErrorOf(anonymous).first, "UNAUTHENTICATED");
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {"Authorization: Bearer not-a-known-token-at-all"})
                .status,
            401);
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {"Authorization: Basic abc"}).status, 401);
  Answer viewer =
      Fetch(port_, "GET", "/api/v1/jobs", {absl::StrCat("Authorization: Bearer ", kViewerToken)});
  EXPECT_EQ(viewer.status, 200) << viewer.body;
  Answer worker =
      Fetch(port_, "GET", "/api/v1/jobs", {absl::StrCat("Authorization: Bearer ", kWorkerToken)});
  EXPECT_EQ(worker.status, 403);
  EXPECT_EQ(ErrorOf(worker).first, "PERMISSION_DENIED");
  EXPECT_TRUE(absl::StrContains(ErrorOf(worker).second, "worker")) << worker.body;

  // A page without credentials is the login form; so is /login.
  Answer page = Fetch(port_, "GET", "/");
  EXPECT_EQ(page.status, 401);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_TRUE(absl::StrContains(page.body, "<form method=\"post\" action=\"/login\">"))
      << page.body;
  EXPECT_NE(page.body, std::string(FindAsset("index.html")->bytes));
  EXPECT_EQ(page.headers["content-security-policy"], kContentSecurityPolicy);
  EXPECT_EQ(Fetch(port_, "GET", "/static/index.html").status, 401);
  Answer form = Fetch(port_, "GET", "/login");
  EXPECT_EQ(form.status, 200);
  EXPECT_TRUE(absl::StrContains(form.body, "name=\"token\"")) << form.body;

  const std::string form_type = kFormType;
  EXPECT_EQ(Fetch(port_, "POST", "/login", {form_type, kSameOrigin}, "token=wrong-token-0123456789")
                .status,
            401);
  EXPECT_EQ(
      Fetch(port_, "POST", "/login", {form_type, kSameOrigin}, absl::StrCat("token=", kWorkerToken))
          .status,
      403);
  EXPECT_EQ(Fetch(port_, "POST", "/login", {form_type, "Origin: http://elsewhere.example"},
                  absl::StrCat("token=", kViewerToken))
                .status,
            403);
  Answer login = Fetch(port_, "POST", "/login", {form_type, kSameOrigin},
                       absl::StrCat("token=", kViewerToken));
  ASSERT_EQ(login.status, 303) << login.body;
  EXPECT_EQ(login.headers["location"], "/");
  const std::string set_cookie = login.headers["set-cookie"];
  EXPECT_TRUE(absl::StrContains(set_cookie, "HttpOnly")) << set_cookie;
  EXPECT_TRUE(absl::StrContains(set_cookie, "SameSite=Strict")) << set_cookie;
  EXPECT_TRUE(absl::StrContains(set_cookie, "Path=/")) << set_cookie;
  ASSERT_TRUE(absl::StartsWith(set_cookie, "zeroshard_session=")) << set_cookie;
  const std::string session = std::string(absl::StripPrefix(
      std::vector<std::string>(absl::StrSplit(set_cookie, ';'))[0], "zeroshard_session="));
  EXPECT_EQ(session.size(), 64u);
  EXPECT_FALSE(absl::StrContains(set_cookie, kViewerToken));
  const std::string cookie = absl::StrCat("Cookie: other=1; zeroshard_session=", session);

  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {cookie}).status, 200);
  Answer index = Fetch(port_, "GET", "/", {cookie});
  EXPECT_EQ(index.status, 200);
  EXPECT_EQ(index.body, std::string(FindAsset("index.html")->bytes));

  // A forged session id is refused.
  std::string forged = session;
  forged[10] = forged[10] == '0' ? '1' : '0';
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {"Cookie: zeroshard_session=" + forged}).status,
            401);

  // Logout ends the session and clears the cookie.
  Answer logout = Fetch(port_, "POST", "/logout", {cookie, kSameOrigin});
  EXPECT_EQ(logout.status, 303);
  EXPECT_EQ(logout.headers["location"], "/login");
  EXPECT_TRUE(absl::StartsWith(logout.headers["set-cookie"], "zeroshard_session=;"))
      << logout.headers["set-cookie"];
  EXPECT_TRUE(absl::StrContains(logout.headers["set-cookie"], "Max-Age=0"));
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {cookie}).status, 401);

  // A session expires after its lifetime.
  Answer again = Fetch(port_, "POST", "/login", {form_type, kSameOrigin},
                       absl::StrCat("token=", kViewerToken));
  ASSERT_EQ(again.status, 303);
  const std::string second_cookie = absl::StrCat(
      "Cookie: ", std::vector<std::string>(absl::StrSplit(again.headers["set-cookie"], ';'))[0]);
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {second_cookie}).status, 200);
  clock_.Advance(SessionOptions().lifetime);
  Answer expired = Fetch(port_, "GET", "/api/v1/jobs", {second_cookie});
  EXPECT_EQ(expired.status, 401);
  EXPECT_TRUE(absl::StartsWith(ErrorOf(expired).second, "session:")) << expired.body;
}

// Issue 25, item 4. Fails on the code before it: there was no Host allow-list, so a
// DNS-rebinding page (Host and Origin both evil.example) logged in (303 with a session cookie)
// and, without a token file, read the JSON API (200).
TEST_F(DashboardTest, ARebindingHostIsRefused) {
  StartServer(/*with_tokens=*/false);
  const std::vector<std::string> rebound = {"Host: evil.example:8080",
                                            "Origin: http://evil.example:8080"};
  for (const std::string target : {"/api/v1/jobs", "/", "/static/app.js", "/login"}) {
    Answer refused = Fetch(port_, "GET", target, rebound);
    EXPECT_EQ(refused.status, 421) << target << ": " << refused.body;
    EXPECT_TRUE(absl::StrContains(refused.body, "--http_allowed_hosts")) << refused.body;
  }
  // Probes and Prometheus (no job data, no credentials) answer whatever the Host; the allowed
  // Hosts are answered as before.
  EXPECT_EQ(Fetch(port_, "GET", "/healthz", rebound).status, 200);
  EXPECT_EQ(Fetch(port_, "GET", "/metrics", rebound).status, 200);
  for (const std::string host : {"Host: 127.0.0.1", "Host: localhost:1", "Host: [::1]:80"}) {
    EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {host}).status, 200) << host;
  }
  server_.reset();

  StartServer(/*with_tokens=*/true);
  Answer login = Fetch(port_, "POST", "/login",
                       {kFormType, "Host: evil.example", "Origin: http://evil.example"},
                       absl::StrCat("token=", kViewerToken));
  EXPECT_EQ(login.status, 421) << login.body;
  EXPECT_EQ(login.headers.count("set-cookie"), 0u);
  server_.reset();

  // --http_allowed_hosts names the hosts clients use: then only those (and /healthz).
  StartServer(/*with_tokens=*/false, /*dashboard=*/true, {"dash.example"});
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {"Host: dash.example:443"}).status, 200);
  Answer local = Fetch(port_, "GET", "/api/v1/jobs");
  EXPECT_EQ(local.status, 421);
  EXPECT_TRUE(absl::StrContains(local.body, "allowed: dash.example)")) << local.body;
  server_.reset();
  // '*' answers any Host, as before the allow-list.
  StartServer(/*with_tokens=*/false, /*dashboard=*/true, {"*"});
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", rebound).status, 200);
}

TEST_F(DashboardTest, ABadAllowedHostIsRefusedAtStartNamingTheFlag) {
  CoordinatorServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.state_dir = dir_ + "/state";
  options.http_allowed_hosts = {"dash.example", "not a host"};
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(options, &clock_);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(server.status().message(), "--http_allowed_hosts: 'not a host'"))
      << server.status();
}

// Issue 25, item 4. Fails on the code before it: a POST without Origin was taken for a
// same-origin one (login 303), and so was one whose only Referer named another site.
TEST_F(DashboardTest, APostMustSayItComesFromThisOrigin) {
  StartServer(/*with_tokens=*/true);
  const std::string token = absl::StrCat("token=", kViewerToken);
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{kFormType}, "origin: a POST must carry an Origin or Referer"},
      {{kFormType, "Origin: null"}, "origin: refused from another origin"},
      {{kFormType, "Origin: http://elsewhere.example"}, "origin: refused"},
      {{kFormType, "Origin: http://127.0.0.1:1"}, "origin: refused"},
      {{kFormType, "Origin: http://127.0.0.1/login"}, "origin: refused"},
      {{kFormType, "Referer: http://elsewhere.example/login"}, "referer: refused"},
      // Origin wins over Referer.
      {{kFormType, "Origin: http://elsewhere.example", "Referer: http://127.0.0.1/login"},
       "origin: refused"},
  };
  for (const auto& [headers, message] : refused) {
    Answer answer = Fetch(port_, "POST", "/login", headers, token);
    EXPECT_EQ(answer.status, 403) << headers.back() << ": " << answer.body;
    EXPECT_TRUE(absl::StrContains(answer.body, "login: " + message))
        << headers.back() << ": " << answer.body;
    EXPECT_EQ(answer.headers.count("set-cookie"), 0u);
  }
  // The dashboard's pages ask browsers to send the Referer (and a real Origin) to this origin.
  EXPECT_EQ(Fetch(port_, "GET", "/login").headers["referrer-policy"], "same-origin");
  EXPECT_EQ(
      Fetch(port_, "POST", "/login", {kFormType, "Referer: http://127.0.0.1/login?x=1"}, token)
          .status,
      303);
  EXPECT_EQ(Fetch(port_, "POST", "/login", {kFormType, "Origin: http://127.0.0.1"}, token).status,
            303);
  // Logout too: without an Origin it ends nothing.
  const std::string cookie = LogIn(kViewerToken);
  EXPECT_EQ(Fetch(port_, "POST", "/logout", {cookie}).status, 403);
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {cookie}).status, 200);
  EXPECT_EQ(Fetch(port_, "POST", "/logout", {cookie, "Referer: http://127.0.0.1/"}).status, 303);
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {cookie}).status, 401);
}

// Issue 25, item 4. Fails on the code before it: past 1024 sessions a login ended the session
// that expired first, whoever's it was, so a viewer's 1040 logins ended the admin's session.
TEST_F(DashboardTest, ManyLoginsOfOneIdentityEndOnlyItsOwnSessions) {
  StartServer(/*with_tokens=*/true);
  const std::string admin = LogIn(kAdminToken);
  clock_.Advance(absl::Seconds(1));
  const size_t logins = SessionOptions().max_sessions + 16;
  std::vector<std::string> viewer;
  for (size_t i = 0; i < logins; ++i) viewer.push_back(LogIn(kViewerToken));
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {admin}).status, 200);
  const size_t cap = SessionOptions().max_sessions_per_identity;
  // The viewer keeps its newest `cap` sessions; its older ones ended.
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {viewer.back()}).status, 200);
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {viewer[logins - cap]}).status, 200);
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {viewer[logins - cap - 1]}).status, 401);
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {viewer.front()}).status, 401);
}

// Issue 25, item 7. Fails on the code before it: a reload that removed a token left the sessions
// it had logged in until they expired (12 hours), so the removed viewer still read the API.
TEST_F(DashboardTest, AReloadEndsTheSessionsOfRevokedTokens) {
  StartServer(/*with_tokens=*/true);
  const std::string viewer = LogIn(kViewerToken);
  const std::string admin = LogIn(kAdminToken);
  ASSERT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {viewer}).status, 200);
  WriteTokens(absl::StrCat(kAdminToken, " admin ada\n"));
  ASSERT_TRUE(server_->ReloadTokens().ok());
  Answer revoked = Fetch(port_, "GET", "/api/v1/jobs", {viewer});
  EXPECT_EQ(revoked.status, 401) << revoked.body;
  // Ended at the reload, not found revoked at this use.
  EXPECT_TRUE(absl::StartsWith(ErrorOf(revoked).second, "session: unknown or expired"))
      << revoked.body;
  EXPECT_EQ(Fetch(port_, "GET", "/", {viewer}).status, 401);
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {admin}).status, 200);
  // The admin's token now names a viewer: its session, made as an admin, ends too.
  WriteTokens(absl::StrCat(kAdminToken, " viewer ada\n"));
  ASSERT_TRUE(server_->ReloadTokens().ok());
  Answer demoted = Fetch(port_, "GET", "/api/v1/jobs", {admin});
  EXPECT_EQ(demoted.status, 401);
  EXPECT_EQ(Fetch(port_, "GET", "/api/v1/jobs", {LogIn(kAdminToken)}).status, 200);
}

}  // namespace
}  // namespace zeroshard::dashboard
