// SQLite-backed job store. Every sqlite3 error is turned into a Status here.
#include "coordinator/job_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zeroshard::coordinator {
namespace {

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY,
  job BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
  job_id TEXT NOT NULL,
  sequence INTEGER NOT NULL,
  event BLOB NOT NULL,
  PRIMARY KEY (job_id, sequence)
);
CREATE TABLE IF NOT EXISTS checkpoint_commits (
  job_id TEXT NOT NULL,
  generation INTEGER NOT NULL,
  step INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  commit_request BLOB NOT NULL,
  PRIMARY KEY (job_id, generation, step, rank)
);
CREATE TABLE IF NOT EXISTS run_assignments (
  job_id TEXT PRIMARY KEY,
  assignment BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS rank_identities (
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  worker_id TEXT NOT NULL,
  worker_name TEXT NOT NULL,
  secret_sha256 BLOB NOT NULL,
  PRIMARY KEY (job_id, rank)
);
CREATE TABLE IF NOT EXISTS worker_names (
  name TEXT PRIMARY KEY,
  worker_id TEXT NOT NULL,
  secret_sha256 BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
  name TEXT PRIMARY KEY,
  value INTEGER NOT NULL
);
)sql";

// A prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    status_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  absl::Status Prepared() const {
    if (status_ == SQLITE_OK) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("sqlite prepare: ", sqlite3_errmsg(db_)));
  }
  void BindText(int index, const std::string& text) {
    sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
  }
  void BindBlob(int index, const std::string& blob) {
    sqlite3_bind_blob(stmt_, index, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  }
  void BindInt(int index, int64_t value) { sqlite3_bind_int64(stmt_, index, value); }
  // SQLITE_ROW, SQLITE_DONE, or an error code.
  int Step() { return sqlite3_step(stmt_); }
  absl::Status StepDone() {
    const int rc = sqlite3_step(stmt_);
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    if (rc == SQLITE_DONE) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("sqlite step: ", sqlite3_errmsg(db_)));
  }
  int64_t ColumnInt(int column) { return sqlite3_column_int64(stmt_, column); }
  std::string ColumnText(int column) {
    const unsigned char* text = sqlite3_column_text(stmt_, column);
    return text == nullptr ? std::string()
                           : std::string(reinterpret_cast<const char*>(text),
                                         sqlite3_column_bytes(stmt_, column));
  }
  std::string ColumnBlob(int column) {
    const void* data = sqlite3_column_blob(stmt_, column);
    return std::string(static_cast<const char*>(data), sqlite3_column_bytes(stmt_, column));
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int status_;
};

template <typename Proto>
absl::StatusOr<std::vector<Proto>> LoadRows(Statement& statement, const char* what) {
  std::vector<Proto> rows;
  int rc;
  while ((rc = statement.Step()) == SQLITE_ROW) {
    Proto row;
    if (!row.ParseFromString(statement.ColumnBlob(0))) {
      return absl::DataLossError(absl::StrCat("state store: a stored ", what, " is corrupt"));
    }
    rows.push_back(std::move(row));
  }
  if (rc != SQLITE_DONE) return absl::InternalError("state store: reading failed");
  return rows;
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& state_dir) {
  std::error_code error;
  std::filesystem::create_directories(state_dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("state_dir: cannot create ", state_dir, ": ", error.message()));
  }
  const std::string path = (std::filesystem::path(state_dir) / "zeroshard.db").string();
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    const std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::FailedPreconditionError(
        absl::StrCat("state_dir: cannot open ", path, ": ", message));
  }
  std::unique_ptr<JobStore> store(new JobStore(db));
  ZS_RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL;"));
  ZS_RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=FULL;"));
  ZS_RETURN_IF_ERROR(store->Exec(kSchema));
  return store;
}

JobStore::JobStore(sqlite3* db) : db_(db) {}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::Status JobStore::Exec(const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    absl::Status status = absl::InternalError(absl::StrCat("state store: ", error ? error : ""));
    sqlite3_free(error);
    return status;
  }
  return absl::OkStatus();
}

absl::Status JobStore::Commit() {
  absl::Status status = Exec("COMMIT;");
  // A failed COMMIT can leave the transaction open (SQLITE_BUSY does): without the rollback,
  // every later BEGIN would fail too.
  if (!status.ok() && sqlite3_get_autocommit(db_) == 0) Exec("ROLLBACK;").IgnoreError();
  return status;
}

absl::Status JobStore::Save(absl::Span<const v1::Job* const> jobs,
                            absl::Span<const v1::JobEvent> events,
                            absl::Span<const v1::Assignment* const> run_assignments,
                            absl::Span<const RankIdentity> rank_identities) {
  ZS_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  absl::Status status = [&]() -> absl::Status {
    Statement put_job(db_, "INSERT OR REPLACE INTO jobs (id, job) VALUES (?, ?);");
    ZS_RETURN_IF_ERROR(put_job.Prepared());
    for (const v1::Job* job : jobs) {
      put_job.BindText(1, job->id());
      put_job.BindBlob(2, job->SerializeAsString());
      ZS_RETURN_IF_ERROR(put_job.StepDone());
    }
    Statement put_event(
        db_, "INSERT OR REPLACE INTO events (job_id, sequence, event) VALUES (?, ?, ?);");
    ZS_RETURN_IF_ERROR(put_event.Prepared());
    for (const v1::JobEvent& event : events) {
      put_event.BindText(1, event.job_id());
      put_event.BindInt(2, event.sequence());
      put_event.BindBlob(3, event.SerializeAsString());
      ZS_RETURN_IF_ERROR(put_event.StepDone());
    }
    Statement put_assignment(
        db_, "INSERT OR REPLACE INTO run_assignments (job_id, assignment) VALUES (?, ?);");
    ZS_RETURN_IF_ERROR(put_assignment.Prepared());
    for (const v1::Assignment* assignment : run_assignments) {
      put_assignment.BindText(1, assignment->job_id());
      put_assignment.BindBlob(2, assignment->SerializeAsString());
      ZS_RETURN_IF_ERROR(put_assignment.StepDone());
    }
    Statement put_identity(db_,
                           "INSERT OR REPLACE INTO rank_identities (job_id, rank, generation, "
                           "worker_id, worker_name, secret_sha256) VALUES (?, ?, ?, ?, ?, ?);");
    ZS_RETURN_IF_ERROR(put_identity.Prepared());
    // Rows of the job's earlier generations (ranks the new one does not have, too) go.
    Statement drop_stale(db_, "DELETE FROM rank_identities WHERE job_id = ? AND generation <> ?;");
    ZS_RETURN_IF_ERROR(drop_stale.Prepared());
    for (const RankIdentity& identity : rank_identities) {
      put_identity.BindText(1, identity.job_id);
      put_identity.BindInt(2, identity.rank);
      put_identity.BindInt(3, identity.generation);
      put_identity.BindText(4, identity.worker_id);
      put_identity.BindText(5, identity.worker_name);
      put_identity.BindBlob(
          6, std::string(identity.secret_sha256.begin(), identity.secret_sha256.end()));
      ZS_RETURN_IF_ERROR(put_identity.StepDone());
      drop_stale.BindText(1, identity.job_id);
      drop_stale.BindInt(2, identity.generation);
      ZS_RETURN_IF_ERROR(drop_stale.StepDone());
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    Exec("ROLLBACK;").IgnoreError();
    return status;
  }
  return Commit();
}

absl::StatusOr<int64_t> JobStore::ReserveWorkerNumbers(int64_t count) {
  ZS_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  absl::StatusOr<int64_t> first = [&]() -> absl::StatusOr<int64_t> {
    Statement read(db_, "SELECT value FROM counters WHERE name = 'next_worker_number';");
    ZS_RETURN_IF_ERROR(read.Prepared());
    const int rc = read.Step();
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
      return absl::InternalError("state store: reading the worker counter failed");
    }
    const int64_t next = rc == SQLITE_ROW ? read.ColumnInt(0) : 1;
    Statement write(db_,
                    "INSERT OR REPLACE INTO counters (name, value) "
                    "VALUES ('next_worker_number', ?);");
    ZS_RETURN_IF_ERROR(write.Prepared());
    write.BindInt(1, next + count);
    ZS_RETURN_IF_ERROR(write.StepDone());
    return next;
  }();
  if (!first.ok()) {
    Exec("ROLLBACK;").IgnoreError();
    return first.status();
  }
  ZS_RETURN_IF_ERROR(Commit());
  return first;
}

absl::Status JobStore::SaveWorkerNames(absl::Span<const WorkerNameHolder> holders,
                                       absl::Span<const std::string> forgotten) {
  ZS_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  absl::Status status = [&]() -> absl::Status {
    Statement put(db_,
                  "INSERT OR REPLACE INTO worker_names (name, worker_id, secret_sha256) "
                  "VALUES (?, ?, ?);");
    ZS_RETURN_IF_ERROR(put.Prepared());
    for (const WorkerNameHolder& holder : holders) {
      put.BindText(1, holder.name);
      put.BindText(2, holder.worker_id);
      put.BindBlob(3, std::string(holder.secret_sha256.begin(), holder.secret_sha256.end()));
      ZS_RETURN_IF_ERROR(put.StepDone());
    }
    Statement drop(db_, "DELETE FROM worker_names WHERE name = ?;");
    ZS_RETURN_IF_ERROR(drop.Prepared());
    for (const std::string& name : forgotten) {
      drop.BindText(1, name);
      ZS_RETURN_IF_ERROR(drop.StepDone());
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    Exec("ROLLBACK;").IgnoreError();
    return status;
  }
  return Commit();
}

absl::StatusOr<std::vector<WorkerNameHolder>> JobStore::LoadWorkerNames() {
  Statement statement(db_,
                      "SELECT name, worker_id, secret_sha256 FROM worker_names ORDER BY name;");
  ZS_RETURN_IF_ERROR(statement.Prepared());
  std::vector<WorkerNameHolder> holders;
  int rc;
  while ((rc = statement.Step()) == SQLITE_ROW) {
    WorkerNameHolder holder;
    holder.name = statement.ColumnText(0);
    holder.worker_id = statement.ColumnText(1);
    const std::string digest = statement.ColumnBlob(2);
    if (digest.size() != holder.secret_sha256.size()) {
      return absl::DataLossError("state store: a stored worker name holder is corrupt");
    }
    std::copy(digest.begin(), digest.end(), holder.secret_sha256.begin());
    holders.push_back(std::move(holder));
  }
  if (rc != SQLITE_DONE) return absl::InternalError("state store: reading failed");
  return holders;
}

absl::StatusOr<std::vector<v1::Job>> JobStore::LoadJobs() {
  Statement statement(db_, "SELECT job FROM jobs ORDER BY id;");
  ZS_RETURN_IF_ERROR(statement.Prepared());
  return LoadRows<v1::Job>(statement, "job");
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::LoadEvents(const std::string& job_id,
                                                               int64_t after_sequence,
                                                               int64_t limit) {
  // The primary key (job_id, sequence) serves this range scan: a page costs its own rows only.
  Statement statement(db_,
                      "SELECT event FROM events WHERE job_id = ? AND sequence > ? "
                      "ORDER BY sequence LIMIT ?;");
  ZS_RETURN_IF_ERROR(statement.Prepared());
  statement.BindText(1, job_id);
  statement.BindInt(2, after_sequence);
  statement.BindInt(3, limit);
  return LoadRows<v1::JobEvent>(statement, "event");
}

absl::StatusOr<JobStore::EventCount> JobStore::CountEvents(const std::string& job_id) {
  Statement statement(db_,
                      "SELECT COUNT(*), COALESCE(MAX(sequence), 0) FROM events "
                      "WHERE job_id = ?;");
  ZS_RETURN_IF_ERROR(statement.Prepared());
  statement.BindText(1, job_id);
  if (statement.Step() != SQLITE_ROW) {
    return absl::InternalError("state store: counting events failed");
  }
  EventCount count;
  count.events = statement.ColumnInt(0);
  count.last_sequence = statement.ColumnInt(1);
  return count;
}

absl::StatusOr<int64_t> JobStore::ThinProgressEvents(const std::string& job_id) {
  ZS_ASSIGN_OR_RETURN(const EventCount count, CountEvents(job_id));
  std::vector<int64_t> doomed;
  {
    Statement oldest(db_, "SELECT event FROM events WHERE job_id = ? ORDER BY sequence LIMIT ?;");
    ZS_RETURN_IF_ERROR(oldest.Prepared());
    oldest.BindText(1, job_id);
    oldest.BindInt(2, count.events / 2);
    int64_t progress_seen = 0;
    int rc;
    while ((rc = oldest.Step()) == SQLITE_ROW) {
      v1::JobEvent event;
      if (!event.ParseFromString(oldest.ColumnBlob(0))) {
        return absl::DataLossError("state store: a stored event is corrupt");
      }
      if (event.type() != v1::PROGRESS) continue;
      if (++progress_seen % 2 == 0) doomed.push_back(event.sequence());
    }
    if (rc != SQLITE_DONE) return absl::InternalError("state store: reading events failed");
  }
  if (doomed.empty()) return 0;
  ZS_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  absl::Status status = [&]() -> absl::Status {
    Statement remove(db_, "DELETE FROM events WHERE job_id = ? AND sequence = ?;");
    ZS_RETURN_IF_ERROR(remove.Prepared());
    for (const int64_t sequence : doomed) {
      remove.BindText(1, job_id);
      remove.BindInt(2, sequence);
      ZS_RETURN_IF_ERROR(remove.StepDone());
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    Exec("ROLLBACK;").IgnoreError();
    return status;
  }
  ZS_RETURN_IF_ERROR(Commit());
  return static_cast<int64_t>(doomed.size());
}

absl::StatusOr<std::vector<v1::Assignment>> JobStore::LoadRunAssignments() {
  Statement statement(db_, "SELECT assignment FROM run_assignments ORDER BY job_id;");
  ZS_RETURN_IF_ERROR(statement.Prepared());
  return LoadRows<v1::Assignment>(statement, "run assignment");
}

absl::StatusOr<std::vector<RankIdentity>> JobStore::LoadRankIdentities() {
  Statement statement(db_,
                      "SELECT job_id, rank, generation, worker_id, worker_name, secret_sha256 "
                      "FROM rank_identities ORDER BY job_id, rank;");
  ZS_RETURN_IF_ERROR(statement.Prepared());
  std::vector<RankIdentity> identities;
  int rc;
  while ((rc = statement.Step()) == SQLITE_ROW) {
    RankIdentity identity;
    identity.job_id = statement.ColumnText(0);
    identity.rank = static_cast<int32_t>(statement.ColumnInt(1));
    identity.generation = statement.ColumnInt(2);
    identity.worker_id = statement.ColumnText(3);
    identity.worker_name = statement.ColumnText(4);
    const std::string digest = statement.ColumnBlob(5);
    if (digest.size() != identity.secret_sha256.size()) {
      return absl::DataLossError("state store: a stored rank identity is corrupt");
    }
    std::copy(digest.begin(), digest.end(), identity.secret_sha256.begin());
    identities.push_back(std::move(identity));
  }
  if (rc != SQLITE_DONE) return absl::InternalError("state store: reading failed");
  return identities;
}

absl::Status JobStore::SaveCheckpointCommit(const v1::CommitCheckpointRequest& commit) {
  Statement statement(db_,
                      "INSERT OR REPLACE INTO checkpoint_commits "
                      "(job_id, generation, step, rank, commit_request) VALUES (?, ?, ?, ?, ?);");
  ZS_RETURN_IF_ERROR(statement.Prepared());
  statement.BindText(1, commit.job_id());
  statement.BindInt(2, commit.generation());
  statement.BindInt(3, commit.step());
  statement.BindInt(4, commit.rank());
  statement.BindBlob(5, commit.SerializeAsString());
  return statement.StepDone();
}

absl::StatusOr<std::vector<v1::CommitCheckpointRequest>> JobStore::LoadCheckpointCommits(
    const std::string& job_id, int64_t generation, int64_t step) {
  Statement statement(db_,
                      "SELECT commit_request FROM checkpoint_commits WHERE job_id = ? AND "
                      "generation = ? AND step = ? ORDER BY rank;");
  ZS_RETURN_IF_ERROR(statement.Prepared());
  statement.BindText(1, job_id);
  statement.BindInt(2, generation);
  statement.BindInt(3, step);
  return LoadRows<v1::CommitCheckpointRequest>(statement, "checkpoint commit");
}

absl::StatusOr<int64_t> JobStore::DeleteCheckpointCommits(const std::string& job_id,
                                                          int64_t generation, int64_t from_step) {
  Statement statement(db_,
                      "DELETE FROM checkpoint_commits WHERE job_id = ? AND generation = ? AND "
                      "step >= ?;");
  ZS_RETURN_IF_ERROR(statement.Prepared());
  statement.BindText(1, job_id);
  statement.BindInt(2, generation);
  statement.BindInt(3, from_step);
  ZS_RETURN_IF_ERROR(statement.StepDone());
  return static_cast<int64_t>(sqlite3_changes(db_));
}

}  // namespace zeroshard::coordinator
