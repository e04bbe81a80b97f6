// TLS credentials from PEM files, for the coordinator's gRPC server and for its clients.
//
// gRPC 1.51 cannot swap a server's certificate in place: a new certificate takes a coordinator
// restart (docs/operations.md, "Rotating certificates").
#ifndef ZEROSHARD_SECURITY_TLS_FILES_H_
#define ZEROSHARD_SECURITY_TLS_FILES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace zeroshard::security {

struct ServerTlsOptions {
  // The server's certificate chain and private key (PEM). Both empty: plaintext.
  std::string cert_file;
  std::string key_file;
  // Clients may present certificates signed by this CA (mTLS); empty: none are asked for.
  std::string client_ca_file;
  // Refuse, at the handshake, clients without a valid certificate (needs client_ca_file).
  bool require_client_cert = false;

  bool enabled() const { return !cert_file.empty(); }
};

// Insecure credentials when TLS is off. Errors name the option (cert_file, key_file,
// client_ca_file): unreadable, not PEM, a certificate that has expired or is not yet valid, or a
// key that does not match the certificate.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& options);

struct ClientTlsOptions {
  // The CA that signed the coordinator's certificate (PEM). Empty: plaintext.
  std::string ca_file;
  // This client's certificate and key for mTLS (both or neither; needs ca_file).
  std::string cert_file;
  std::string key_file;

  bool enabled() const { return !ca_file.empty(); }
};

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsOptions& options);

// The whole file, or NOT_FOUND naming `option` and `path`.
absl::StatusOr<std::string> ReadPemFile(const std::string& option, const std::string& path);

// OK when every certificate in `pem` is valid now; else FAILED_PRECONDITION naming `option`
// and the certificate's validity window. INVALID_ARGUMENT when `pem` holds no certificate.
absl::Status CheckCertificateDates(const std::string& option, const std::string& pem);

}  // namespace zeroshard::security

#endif  // ZEROSHARD_SECURITY_TLS_FILES_H_
