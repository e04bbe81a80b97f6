#include "security/tls_files.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zeroshard::security {
namespace {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* x509) const { X509_free(x509); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;

BioPtr MemoryBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

std::string AsText(const ASN1_TIME* time) {
  BioPtr out(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(out.get(), time);
  char* data = nullptr;
  const long size = BIO_get_mem_data(out.get(), &data);
  return std::string(data, size);
}

// The key must be the private half of the chain's first certificate.
absl::Status CheckKeyMatches(const std::string& cert_pem, const std::string& key_pem,
                             const std::string& key_option) {
  BioPtr cert_bio = MemoryBio(cert_pem);
  X509Ptr cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  BioPtr key_bio = MemoryBio(key_pem);
  KeyPtr key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(key_option, ": holds no PEM private key"));
  }
  if (cert == nullptr || X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_option, ": the key does not belong to the certificate"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& option, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(option, ": cannot read ", path, ": ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status CheckCertificateDates(const std::string& option, const std::string& pem) {
  BioPtr bio = MemoryBio(pem);
  int certificates = 0;
  while (true) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (cert == nullptr) break;
    ++certificates;
    const ASN1_TIME* not_before = X509_get0_notBefore(cert.get());
    const ASN1_TIME* not_after = X509_get0_notAfter(cert.get());
    if (X509_cmp_current_time(not_after) <= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(option, ": certificate ", certificates, " expired at ", AsText(not_after)));
    }
    if (X509_cmp_current_time(not_before) >= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          option, ": certificate ", certificates, " is not valid before ", AsText(not_before)));
    }
  }
  if (certificates == 0) {
    return absl::InvalidArgumentError(absl::StrCat(option, ": holds no PEM certificate"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& options) {
  if (!options.enabled()) {
    if (!options.key_file.empty() || !options.client_ca_file.empty() ||
        options.require_client_cert) {
      return absl::InvalidArgumentError(
          "tls_cert_file: required with tls_key_file, tls_client_ca_file or "
          "tls_require_client_cert");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.key_file.empty()) {
    return absl::InvalidArgumentError("tls_key_file: required with tls_cert_file");
  }
  if (options.require_client_cert && options.client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "tls_client_ca_file: required with tls_require_client_cert (the CA clients' "
        "certificates are checked against)");
  }
  ZS_ASSIGN_OR_RETURN(const std::string cert, ReadPemFile("tls_cert_file", options.cert_file));
  ZS_ASSIGN_OR_RETURN(const std::string key, ReadPemFile("tls_key_file", options.key_file));
  ZS_RETURN_IF_ERROR(CheckCertificateDates("tls_cert_file", cert));
  ZS_RETURN_IF_ERROR(CheckKeyMatches(cert, key, "tls_key_file"));
  grpc::SslServerCredentialsOptions ssl(
      options.client_ca_file.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : (options.require_client_cert
                 ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                 : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY));
  if (!options.client_ca_file.empty()) {
    ZS_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                        ReadPemFile("tls_client_ca_file", options.client_ca_file));
    ZS_RETURN_IF_ERROR(CheckCertificateDates("tls_client_ca_file", ssl.pem_root_certs));
  }
  ssl.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsOptions& options) {
  if (!options.enabled()) {
    if (!options.cert_file.empty() || !options.key_file.empty()) {
      return absl::InvalidArgumentError(
          "ca: required with cert and key (a client certificate is sent over TLS only)");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError("cert, key: give both or neither");
  }
  grpc::SslCredentialsOptions ssl;
  ZS_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile("ca", options.ca_file));
  ZS_RETURN_IF_ERROR(CheckCertificateDates("ca", ssl.pem_root_certs));
  if (!options.cert_file.empty()) {
    ZS_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPemFile("cert", options.cert_file));
    ZS_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPemFile("key", options.key_file));
    ZS_RETURN_IF_ERROR(CheckCertificateDates("cert", ssl.pem_cert_chain));
    ZS_RETURN_IF_ERROR(CheckKeyMatches(ssl.pem_cert_chain, ssl.pem_private_key, "key"));
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace zeroshard::security
