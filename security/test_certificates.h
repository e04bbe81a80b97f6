// Tests only: a throwaway PKI made with the openssl tool at test time. A CA, certificates it
// issues (valid, expired, not yet valid), and a second CA that the first does not trust.
#ifndef ZEROSHARD_SECURITY_TEST_CERTIFICATES_H_
#define ZEROSHARD_SECURITY_TEST_CERTIFICATES_H_

#include <string>

#include "absl/status/statusor.h"

namespace zeroshard::security {

struct CertificateFiles {
  std::string cert;  // PEM certificate path
  std::string key;   // PEM private key path
};

enum class Validity { kValid, kExpired, kNotYetValid };

// Thread contract: one thread at a time (it runs openssl in `dir`).
class TestCertificateAuthority {
 public:
  // Makes a CA named `name` (its certificate is ca_cert()) under `dir`, which must exist. A CA of
  // the same name already there is replaced: its serials would clash with the new one's.
  static absl::StatusOr<TestCertificateAuthority> Create(const std::string& dir,
                                                         const std::string& name);

  const std::string& ca_cert() const { return ca_.cert; }

  // A certificate for subject CN `common_name`, valid for 127.0.0.1 and localhost (so it serves
  // as a server certificate too), with `validity`.
  absl::StatusOr<CertificateFiles> Issue(const std::string& common_name,
                                         Validity validity = Validity::kValid);

 private:
  std::string dir_;
  CertificateFiles ca_;
  int issued_ = 0;
};

}  // namespace zeroshard::security

#endif  // ZEROSHARD_SECURITY_TEST_CERTIFICATES_H_
