// The gRPC metadata keys of ZeroShard's credentials (docs/api.md, "Identities and roles").
#ifndef ZEROSHARD_SECURITY_METADATA_H_
#define ZEROSHARD_SECURITY_METADATA_H_

namespace zeroshard::security {

// "Bearer <token>", a token of the coordinator's token file.
inline constexpr char kAuthorizationKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";
// The secret RegisterWorker returned; the worker role's later calls must present it.
inline constexpr char kWorkerSecretKey[] = "zeroshard-worker-secret";

}  // namespace zeroshard::security

#endif  // ZEROSHARD_SECURITY_METADATA_H_
