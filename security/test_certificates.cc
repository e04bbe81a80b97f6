#include "security/test_certificates.h"

#include <cstdlib>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zeroshard::security {
namespace {

// Runs `command` with a shell; its output goes to `log`, which the error quotes by path.
absl::Status Run(const std::string& command, const std::string& log) {
  const std::string full = absl::StrCat("(", command, ") >>'", log, "' 2>&1");
  if (std::system(full.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("openssl failed (see ", log, "): ", command));
  }
  return absl::OkStatus();
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

constexpr char kKeyOptions[] = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

}  // namespace

absl::StatusOr<TestCertificateAuthority> TestCertificateAuthority::Create(const std::string& dir,
                                                                          const std::string& name) {
  TestCertificateAuthority ca;
  ca.dir_ = absl::StrCat(dir, "/", name);
  ca.ca_ = {absl::StrCat(ca.dir_, "/ca.pem"), absl::StrCat(ca.dir_, "/ca.key")};
  const std::string log = absl::StrCat(dir, "/", name, ".log");
  if (absl::Status made =
          Run(absl::StrCat("rm -rf '", ca.dir_, "' && mkdir -p '", ca.dir_, "/issued' && touch '",
                           ca.dir_, "/index.txt' && echo 1000 > '", ca.dir_, "/serial'"),
              log);
      !made.ok()) {
    return made;
  }
  // `openssl ca` (not `x509 -req`) because only it takes explicit start and end dates.
  if (absl::Status written =
          WriteFile(absl::StrCat(ca.dir_, "/ca.cnf"), absl::StrCat(R"([ca]
default_ca = test_ca
[test_ca]
database = )",
                                                                   ca.dir_, R"(/index.txt
new_certs_dir = )",
                                                                   ca.dir_, R"(/issued
serial = )",
                                                                   ca.dir_, R"(/serial
certificate = )",
                                                                   ca.ca_.cert, R"(
private_key = )",
                                                                   ca.ca_.key, R"(
default_md = sha256
policy = any_name
unique_subject = no
copy_extensions = copy
[any_name]
commonName = supplied
)"));
      !written.ok()) {
    return written;
  }
  if (absl::Status made =
          Run(absl::StrCat("openssl req -x509 ", kKeyOptions, " -days 3650 -subj '/CN=", name,
                           "' -keyout '", ca.ca_.key, "' -out '", ca.ca_.cert, "'"),
              log);
      !made.ok()) {
    return made;
  }
  return ca;
}

absl::StatusOr<CertificateFiles> TestCertificateAuthority::Issue(const std::string& common_name,
                                                                 Validity validity) {
  const std::string base = absl::StrCat(dir_, "/", common_name, "-", ++issued_);
  CertificateFiles files{base + ".pem", base + ".key"};
  const std::string log = base + ".log";
  std::string dates;
  switch (validity) {
    case Validity::kValid:
      dates = "-days 30";
      break;
    case Validity::kExpired:
      dates = "-startdate 20200101000000Z -enddate 20210101000000Z";
      break;
    case Validity::kNotYetValid:
      dates = "-startdate 20900101000000Z -enddate 20910101000000Z";
      break;
  }
  if (absl::Status made =
          Run(absl::StrCat("openssl req -new ", kKeyOptions, " -subj '/CN=", common_name,
                           "' -addext 'subjectAltName=IP:127.0.0.1,DNS:localhost' -keyout '",
                           files.key, "' -out '", base, ".csr'"),
              log);
      !made.ok()) {
    return made;
  }
  if (absl::Status made =
          Run(absl::StrCat("openssl ca -batch -notext -config '", dir_, "/ca.cnf' -in '", base,
                           ".csr' -out '", files.cert, "' ", dates),
              log);
      !made.ok()) {
    return made;
  }
  return files;
}

}  // namespace zeroshard::security
