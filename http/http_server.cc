// libmicrohttpd behind HttpServer: one epoll thread, bounded connections, idle timeout.
#include "http/http_server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace zeroshard::http {
namespace {

// The address of a connection's request once its headers are in; its body (if any) is dropped.
int headers_seen_marker;

MHD_Result Answer(void* server, MHD_Connection* connection, const char* url, const char* method,
                  const char* /*version*/, const char* /*upload_data*/, size_t* upload_data_size,
                  void** request_state) {
  // libmicrohttpd calls once when the headers are in, then once per piece of body, then once
  // more; answering on the last call keeps a request with a body well-formed on keep-alive.
  if (*request_state == nullptr) {
    *request_state = &headers_seen_marker;
    return MHD_YES;
  }
  if (*upload_data_size != 0) {
    *upload_data_size = 0;
    return MHD_YES;
  }
  const HttpResponse answer = static_cast<const HttpServer*>(server)->Respond(method, url);
  MHD_Response* response = MHD_create_response_from_buffer(
      answer.body.size(), const_cast<char*>(answer.body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  if (!answer.content_type.empty()) {
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, answer.content_type.c_str());
  }
  if (answer.status == MHD_HTTP_METHOD_NOT_ALLOWED) {
    MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  }
  const MHD_Result queued =
      MHD_queue_response(connection, static_cast<unsigned int>(answer.status), response);
  MHD_destroy_response(response);
  return queued;
}

// "[::1]" -> "::1": the bracketed form of an IPv6 host in host:port addresses.
std::string Unbracket(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options) {
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_connections: ", options.max_connections, " must be at least 1"));
  }
  if (options.idle_timeout < absl::Seconds(1) ||
      options.idle_timeout != absl::Seconds(absl::ToInt64Seconds(options.idle_timeout))) {
    return absl::InvalidArgumentError(
        absl::StrCat("idle_timeout: ", absl::FormatDuration(options.idle_timeout),
                     " must be a whole number of seconds, at least 1s"));
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port: ", options.port, " is out of range"));
  }
  const std::string host = Unbracket(options.host);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* resolved = nullptr;
  if (const int error = getaddrinfo(host.c_str(), nullptr, &hints, &resolved); error != 0) {
    return absl::UnavailableError(
        absl::StrCat("port: cannot resolve host '", host, "': ", gai_strerror(error)));
  }
  sockaddr_storage address{};
  std::memcpy(&address, resolved->ai_addr, resolved->ai_addrlen);
  freeaddrinfo(resolved);
  unsigned int flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ITC;
  const uint16_t port = htons(static_cast<uint16_t>(options.port));
  if (address.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&address)->sin6_port = port;
    flags |= MHD_USE_IPv6;
  } else {
    reinterpret_cast<sockaddr_in*>(&address)->sin_port = port;
  }

  std::unique_ptr<HttpServer> server(new HttpServer());
  server->options_ = std::move(options);
  server->daemon_ = MHD_start_daemon(
      flags, /*port, taken from the address*/ 0, /*accept_policy*/ nullptr, nullptr, &Answer,
      server.get(), MHD_OPTION_SOCK_ADDR, &address, MHD_OPTION_CONNECTION_LIMIT,
      static_cast<unsigned int>(server->options_.max_connections), MHD_OPTION_CONNECTION_TIMEOUT,
      static_cast<unsigned int>(absl::ToInt64Seconds(server->options_.idle_timeout)),
      MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("port: cannot listen on ", server->options_.host, ":", server->options_.port));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info == nullptr ? 0 : info->port;
  if (server->port_ == 0) {
    return absl::InternalError("port: libmicrohttpd does not report the port it listens on");
  }
  return server;
}

HttpServer::~HttpServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

HttpResponse HttpServer::Respond(const std::string& method, const std::string& path) const {
  const auto handler = options_.handlers.find(path);
  if (handler == options_.handlers.end()) {
    return {MHD_HTTP_NOT_FOUND, "text/plain", "not found\n"};
  }
  if (method != MHD_HTTP_METHOD_GET && method != MHD_HTTP_METHOD_HEAD) {
    return {MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", "method not allowed\n"};
  }
  return handler->second();
}

}  // namespace zeroshard::http
