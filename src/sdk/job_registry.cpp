// The SQLite side of the local job registry: schema, statements and the conditional updates that
// keep concurrent writers (a job's supervisor, readers marking dead jobs, deleters) consistent.
// Lists and maps are stored as JSON text; SQL is only asked to filter by name, runtime and status.
#include "sdk/job_registry.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ktune::sdk {

using nlohmann::json;

const std::set<std::string>& all_job_statuses() {
  static const std::set<std::string> s = {kCreated, kRunning, kComplete, kFailed};
  return s;
}

const StepRecord* TrainJobRecord::step(const std::string& step_name) const {
  for (const StepRecord& s : steps)
    if (s.name == step_name) return &s;
  return nullptr;
}

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  name TEXT PRIMARY KEY,
  runtime TEXT NOT NULL,
  trainer_type TEXT NOT NULL,
  num_nodes INTEGER NOT NULL,
  num_proc_per_node INTEGER NOT NULL,
  recipe TEXT NOT NULL,
  config TEXT NOT NULL,
  status TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  created_at REAL NOT NULL,
  started_at REAL NOT NULL DEFAULT 0,
  finished_at REAL NOT NULL DEFAULT 0,
  workspace TEXT NOT NULL,
  supervisor_pid INTEGER NOT NULL DEFAULT 0,
  supervisor_start_time INTEGER NOT NULL DEFAULT 0,
  progress TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS steps (
  job TEXT NOT NULL REFERENCES jobs(name) ON DELETE CASCADE,
  name TEXT NOT NULL,
  idx INTEGER NOT NULL,
  status TEXT NOT NULL,
  command TEXT NOT NULL,
  env TEXT NOT NULL,
  secret_env_keys TEXT NOT NULL,
  working_dir TEXT NOT NULL,
  depends_on TEXT NOT NULL,
  node_rank INTEGER NOT NULL,
  num_proc INTEGER NOT NULL,
  device TEXT NOT NULL,
  device_count TEXT NOT NULL,
  pid INTEGER NOT NULL DEFAULT 0,
  pid_start_time INTEGER NOT NULL DEFAULT 0,
  exit_code INTEGER NOT NULL DEFAULT -1,
  started_at REAL NOT NULL DEFAULT 0,
  finished_at REAL NOT NULL DEFAULT 0,
  log_path TEXT NOT NULL,
  progress_path TEXT NOT NULL,
  PRIMARY KEY (job, name)
);
CREATE INDEX IF NOT EXISTS jobs_by_runtime ON jobs(runtime);
CREATE TABLE IF NOT EXISTS exports (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job TEXT NOT NULL REFERENCES jobs(name) ON DELETE CASCADE,
  status TEXT NOT NULL,
  destination TEXT NOT NULL,
  parts TEXT NOT NULL,
  started_at REAL NOT NULL,
  finished_at REAL NOT NULL DEFAULT 0,
  summary TEXT NOT NULL DEFAULT '',
  error TEXT NOT NULL DEFAULT ''
);
)sql";

// One prepared statement; binds by position (1-based), steps once or row by row.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql, const std::string& where) : db_(db), where_(where) {
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr) != SQLITE_OK)
      throw Error(where_, std::string("cannot prepare statement: ") + sqlite3_errmsg(db));
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement& bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.c_str(), int(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& bind(int i, const char* v) { return bind(i, std::string(v)); }
  Statement& bind(int i, double v) {
    sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  Statement& bind(int i, long long v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Statement& bind(int i, int v) { return bind(i, (long long)v); }
  // true while a row is available
  bool step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw Error(where_, std::string("sqlite: ") + sqlite3_errmsg(db_));
  }
  std::string text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), size_t(sqlite3_column_bytes(stmt_, col))) : "";
  }
  long long integer(int col) const { return sqlite3_column_int64(stmt_, col); }
  double real(int col) const { return sqlite3_column_double(stmt_, col); }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  std::string where_;
};

// Runs `sql`, and runs it again while SQLite answers "busy" or "locked" without having
// waited: it does so, busy handler or not, when waiting could deadlock (a connection that read the
// schema of a database another is switching to WAL or creating tables in) or when its snapshot went
// stale. Several clients making a new registry at once meet exactly that. Gives up after `seconds`.
void exec_retrying_busy(sqlite3* db, const char* sql, const std::string& where, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (int attempt = 0;; ++attempt) {
    char* err = nullptr;
    const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
    if (rc == SQLITE_OK) return;
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    const int primary = rc & 0xff;
    if ((primary != SQLITE_BUSY && primary != SQLITE_LOCKED) || std::chrono::steady_clock::now() >= deadline)
      throw Error(where, "sqlite: " + msg);
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + 5 * std::min(attempt, 9)));
  }
}

// Runs `sql`; an error is thrown at once (the connection's busy handler already waited for locks).
void exec(sqlite3* db, const char* sql, const std::string& where) { exec_retrying_busy(db, sql, where, 0); }

// BEGIN IMMEDIATE takes the write lock up front, so two writers never deadlock upgrading a read.
class Transaction {
 public:
  Transaction(sqlite3* db, const std::string& where) : db_(db), where_(where) { exec(db_, "BEGIN IMMEDIATE", where_); }
  void commit() {
    exec(db_, "COMMIT", where_);
    done_ = true;
  }
  ~Transaction() {
    if (!done_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }

 private:
  sqlite3* db_;
  std::string where_;
  bool done_ = false;
};

// Runs one UPDATE/DELETE in its own IMMEDIATE transaction and says how many rows it changed.
template <typename... Values>
int update(sqlite3* db, const std::string& sql, const std::string& where, const Values&... values) {
  Transaction tx(db, where);
  Statement st(db, sql, where);
  int i = 0;
  (st.bind(++i, values), ...);
  st.step();
  int n = sqlite3_changes(db);
  tx.commit();
  return n;
}

}  // namespace

JobRegistry::JobRegistry(const std::string& db_path) : path_(db_path) {
  if (sqlite3_open_v2(db_path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw Error(db_path, "cannot open the job registry: " + msg);
  }
  // Writers wait for each other (up to 30 s) instead of failing with SQLITE_BUSY.
  sqlite3_busy_timeout(db_, 30000);
  try {
    exec_retrying_busy(db_, "PRAGMA journal_mode=WAL", path_, 30);
    exec(db_, "PRAGMA synchronous=NORMAL", path_);
    exec(db_, "PRAGMA foreign_keys=ON", path_);
    exec_retrying_busy(db_, kSchema, path_, 30);
  } catch (...) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
}

JobRegistry::~JobRegistry() {
  if (db_) sqlite3_close(db_);
}

void JobRegistry::insert(const TrainJobRecord& job) {
  const std::string where = path_ + ": job " + job.name;
  Transaction tx(db_, where);
  {
    Statement exists(db_, "SELECT 1 FROM jobs WHERE name = ?", where);
    exists.bind(1, job.name);
    if (exists.step()) throw Error(where, "a TrainJob with this name already exists");
  }
  Statement ins(db_,
                "INSERT INTO jobs (name, runtime, trainer_type, num_nodes, num_proc_per_node, recipe, config, status,"
                " reason, created_at, started_at, finished_at, workspace, supervisor_pid, supervisor_start_time,"
                " progress) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                where);
  ins.bind(1, job.name).bind(2, job.runtime).bind(3, job.trainer_type).bind(4, job.num_nodes)
      .bind(5, job.num_proc_per_node).bind(6, job.recipe).bind(7, job.config).bind(8, job.status)
      .bind(9, job.reason).bind(10, job.created_at).bind(11, job.started_at).bind(12, job.finished_at)
      .bind(13, job.workspace).bind(14, job.supervisor_pid).bind(15, job.supervisor_start_time)
      .bind(16, job.progress.to_json());
  ins.step();
  for (const StepRecord& s : job.steps) {
    Statement st(db_,
                 "INSERT INTO steps (job, name, idx, status, command, env, secret_env_keys, working_dir, depends_on,"
                 " node_rank, num_proc, device, device_count, pid, pid_start_time, exit_code, started_at,"
                 " finished_at, log_path, progress_path) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                 where);
    st.bind(1, job.name).bind(2, s.name).bind(3, s.index).bind(4, s.status).bind(5, json(s.command).dump())
        .bind(6, json(s.env).dump()).bind(7, json(s.secret_env_keys).dump()).bind(8, s.working_dir)
        .bind(9, json(s.depends_on).dump()).bind(10, s.node_rank).bind(11, s.num_proc).bind(12, s.device)
        .bind(13, s.device_count).bind(14, s.pid).bind(15, s.pid_start_time).bind(16, s.exit_code)
        .bind(17, s.started_at).bind(18, s.finished_at).bind(19, s.log_path).bind(20, s.progress_path);
    st.step();
  }
  tx.commit();
}

std::vector<TrainJobRecord> JobRegistry::query_jobs(const std::string& where_sql, const std::string& arg) {
  const std::string where = path_;
  std::vector<TrainJobRecord> jobs;
  // One read transaction: a job and its steps are read from the same snapshot.
  exec(db_, "BEGIN", where);
  try {
    Statement q(db_,
                "SELECT name, runtime, trainer_type, num_nodes, num_proc_per_node, recipe, config, status, reason,"
                " created_at, started_at, finished_at, workspace, supervisor_pid, supervisor_start_time, progress"
                " FROM jobs " + where_sql + " ORDER BY created_at, name",
                where);
    if (!arg.empty()) q.bind(1, arg);
    while (q.step()) {
      TrainJobRecord j;
      j.name = q.text(0);
      j.runtime = q.text(1);
      j.trainer_type = q.text(2);
      j.num_nodes = int(q.integer(3));
      j.num_proc_per_node = int(q.integer(4));
      j.recipe = q.text(5);
      j.config = q.text(6);
      j.status = q.text(7);
      j.reason = q.text(8);
      j.created_at = q.real(9);
      j.started_at = q.real(10);
      j.finished_at = q.real(11);
      j.workspace = q.text(12);
      j.supervisor_pid = int(q.integer(13));
      j.supervisor_start_time = q.integer(14);
      j.progress = JobProgress::from_json(q.text(15));
      jobs.push_back(std::move(j));
    }
    for (TrainJobRecord& j : jobs) {
      Statement s(db_,
                  "SELECT name, idx, status, command, env, secret_env_keys, working_dir, depends_on, node_rank,"
                  " num_proc, device, device_count, pid, pid_start_time, exit_code, started_at, finished_at,"
                  " log_path, progress_path FROM steps WHERE job = ? ORDER BY idx",
                  where);
      s.bind(1, j.name);
      while (s.step()) {
        StepRecord r;
        r.name = s.text(0);
        r.index = int(s.integer(1));
        r.status = s.text(2);
        r.command = json::parse(s.text(3)).get<std::vector<std::string>>();
        r.env = json::parse(s.text(4)).get<std::map<std::string, std::string>>();
        r.secret_env_keys = json::parse(s.text(5)).get<std::vector<std::string>>();
        r.working_dir = s.text(6);
        r.depends_on = json::parse(s.text(7)).get<std::vector<std::string>>();
        r.node_rank = int(s.integer(8));
        r.num_proc = int(s.integer(9));
        r.device = s.text(10);
        r.device_count = s.text(11);
        r.pid = int(s.integer(12));
        r.pid_start_time = s.integer(13);
        r.exit_code = int(s.integer(14));
        r.started_at = s.real(15);
        r.finished_at = s.real(16);
        r.log_path = s.text(17);
        r.progress_path = s.text(18);
        j.steps.push_back(std::move(r));
      }
      Statement e(db_,
                  "SELECT id, status, destination, parts, started_at, finished_at, summary, error FROM exports"
                  " WHERE job = ? ORDER BY id",
                  where);
      e.bind(1, j.name);
      while (e.step()) {
        ExportRecord x;
        x.id = int(e.integer(0));
        x.status = e.text(1);
        x.destination = e.text(2);
        x.parts = e.text(3);
        x.started_at = e.real(4);
        x.finished_at = e.real(5);
        x.summary_json = e.text(6);
        x.error = e.text(7);
        j.exports.push_back(std::move(x));
      }
    }
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
  exec(db_, "COMMIT", where);
  return jobs;
}

std::optional<TrainJobRecord> JobRegistry::find(const std::string& name) {
  std::vector<TrainJobRecord> jobs = query_jobs("WHERE name = ?", name);
  if (jobs.empty()) return std::nullopt;
  return std::move(jobs.front());
}

std::vector<TrainJobRecord> JobRegistry::list(const std::string& runtime) {
  return runtime.empty() ? query_jobs("", "") : query_jobs("WHERE runtime = ?", runtime);
}

bool JobRegistry::remove(const std::string& name) {
  const std::string where = path_ + ": job " + name;
  Transaction tx(db_, where);
  Statement s(db_, "DELETE FROM steps WHERE job = ?", where);
  s.bind(1, name).step();
  Statement x(db_, "DELETE FROM exports WHERE job = ?", where);
  x.bind(1, name).step();
  Statement j(db_, "DELETE FROM jobs WHERE name = ?", where);
  j.bind(1, name).step();
  bool changed = sqlite3_changes(db_) > 0;
  tx.commit();
  return changed;
}

int JobRegistry::begin_export(const std::string& job, const std::string& destination, const std::string& parts,
                              double now) {
  const std::string where = path_ + ": job " + job;
  Transaction tx(db_, where);
  {
    Statement exists(db_, "SELECT 1 FROM jobs WHERE name = ?", where);
    exists.bind(1, job);
    if (!exists.step()) throw Error("TrainJob " + job, "not found in " + path_);
  }
  Statement st(db_, "INSERT INTO exports (job, status, destination, parts, started_at) VALUES (?,?,?,?,?)", where);
  st.bind(1, job).bind(2, kRunning).bind(3, destination).bind(4, parts).bind(5, now).step();
  const int id = int(sqlite3_last_insert_rowid(db_));
  tx.commit();
  return id;
}

bool JobRegistry::finish_export(int id, const std::string& status, const std::string& summary_json,
                                const std::string& error, double now) {
  return update(db_, "UPDATE exports SET status = ?, summary = ?, error = ?, finished_at = ? WHERE id = ? AND status = 'Running'",
                path_ + ": export " + std::to_string(id), status, summary_json, error, now, id) > 0;
}

bool JobRegistry::set_supervisor(const std::string& name, int pid, long long start_time) {
  return update(db_, "UPDATE jobs SET supervisor_pid = ?, supervisor_start_time = ? WHERE name = ?",
                               path_ + ": job " + name, pid, start_time, name) > 0;
}

bool JobRegistry::mark_job_running(const std::string& name, double now) {
  return update(db_, "UPDATE jobs SET status = 'Running', started_at = ? WHERE name = ? AND status = 'Created'",
                               path_ + ": job " + name, now, name) > 0;
}

bool JobRegistry::finish_job(const std::string& name, const std::string& status, const std::string& reason,
                             double now) {
  check(is_terminal(status), path_ + ": job " + name, "finish_job needs Complete or Failed, got " + status);
  return update(db_, 
             "UPDATE jobs SET status = ?, reason = ?, finished_at = ? WHERE name = ? AND status IN ('Created','Running')",
             path_ + ": job " + name, status, reason, now, name) > 0;
}

bool JobRegistry::fail_job_if_supervisor(const std::string& name, int supervisor_pid, const std::string& reason,
                                         double now) {
  return update(db_, 
             "UPDATE jobs SET status = 'Failed', reason = ?, finished_at = ? WHERE name = ?"
             " AND status IN ('Created','Running') AND supervisor_pid = ?",
             path_ + ": job " + name, reason, now, name, supervisor_pid) > 0;
}

bool JobRegistry::set_progress(const std::string& name, const JobProgress& progress) {
  return update(db_, "UPDATE jobs SET progress = ? WHERE name = ?", path_ + ": job " + name,
                               progress.to_json(), name) > 0;
}

bool JobRegistry::mark_step_running(const std::string& job, const std::string& step, int pid, long long start_time,
                                    double now, const std::vector<std::string>& command,
                                    const std::map<std::string, std::string>& env) {
  return update(db_, 
             "UPDATE steps SET status = 'Running', pid = ?, pid_start_time = ?, started_at = ?, command = ?, env = ?"
             " WHERE job = ? AND name = ? AND status = 'Created'",
             path_ + ": job " + job + " step " + step, pid, start_time, now, json(command).dump(), json(env).dump(),
             job, step) > 0;
}

bool JobRegistry::finish_step(const std::string& job, const std::string& step, const std::string& status,
                              int exit_code, double now) {
  check(is_terminal(status), path_ + ": job " + job + " step " + step,
        "finish_step needs Complete or Failed, got " + status);
  return update(db_, 
             "UPDATE steps SET status = ?, exit_code = ?, finished_at = ? WHERE job = ? AND name = ?"
             " AND status IN ('Created','Running')",
             path_ + ": job " + job + " step " + step, status, exit_code, now, job, step) > 0;
}

int JobRegistry::fail_running_steps(const std::string& job, double now) {
  return update(db_, 
      "UPDATE steps SET status = 'Failed', finished_at = ? WHERE job = ? AND status = 'Running'",
      path_ + ": job " + job, now, job);
}

}  // namespace ktune::sdk
