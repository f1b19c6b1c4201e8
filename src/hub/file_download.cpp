#include "hub/file_download.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/log.h"
#include "hub/digest.h"

namespace ktune::hub {

static int64_t file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  return int64_t(st.st_size);
}

static std::string lower_hex(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

static std::string first_mismatch(const std::string& path, const ExpectedContent& e) {
  int64_t size = file_size(path);
  if (size < 0) return "file is missing";
  if (e.size >= 0 && size != e.size)
    return "size " + std::to_string(size) + " bytes, expected " + std::to_string(e.size);
  if (!e.sha256.empty()) {
    std::string got = sha256_file_hex(path);
    if (got != lower_hex(e.sha256)) return "sha256 " + got + ", expected " + lower_hex(e.sha256);
  }
  if (!e.git_sha1.empty()) {
    std::string got = git_blob_sha1_file_hex(path);
    if (got != lower_hex(e.git_sha1)) return "git blob id " + got + ", expected " + lower_hex(e.git_sha1);
  }
  if (!e.md5.empty()) {
    std::string got = md5_file_hex(path);
    if (got != lower_hex(e.md5)) return "md5 " + got + ", expected " + lower_hex(e.md5);
  }
  if (!e.multipart_md5.empty() && e.part_size > 0) {
    std::string got = multipart_md5_file_hex(path, e.part_size);
    if (got != lower_hex(e.multipart_md5))
      return "multipart md5 " + got + " (parts of " + std::to_string(e.part_size) + " bytes), expected " +
             lower_hex(e.multipart_md5);
  }
  return "";
}

bool local_file_matches(const std::string& path, const ExpectedContent& expected) {
  bool anything_known = expected.size >= 0 || !expected.sha256.empty() || !expected.git_sha1.empty() ||
                        !expected.md5.empty() || !expected.multipart_md5.empty();
  return anything_known && first_mismatch(path, expected).empty();
}

void verify_content(const std::string& path, const ExpectedContent& expected, const std::string& where) {
  std::string problem = first_mismatch(path, expected);
  if (!problem.empty()) throw Error(where, "downloaded content does not match the store's record: " + problem);
}

namespace {

// Appends (206) or rewrites (200) the partial file; counts the bytes.
class PartialFileSink : public BodySink {
 public:
  PartialFileSink(std::string path, uint64_t offset, std::string where)
      : path_(std::move(path)), offset_(offset), where_(std::move(where)) {}
  ~PartialFileSink() override { close(); }

  void begin(const HttpResponse& head) override {
    close();
    if (head.status == 206) {
      // "bytes START-END/TOTAL": the server must continue exactly where the partial ends.
      std::string range = head.header("content-range");
      unsigned long long start = 0;
      if (std::sscanf(range.c_str(), "bytes %llu-", &start) != 1 || start != offset_)
        throw Error(where_, "server answered a resume from byte " + std::to_string(offset_) +
                                " with Content-Range '" + range + "'");
      file_ = std::fopen(path_.c_str(), "ab");
      resumed_ = offset_ > 0;
    } else {
      file_ = std::fopen(path_.c_str(), "wb");  // a full body: start over
      resumed_ = false;
    }
    if (file_ == nullptr) throw Error(path_, std::string("cannot write partial download: ") + std::strerror(errno));
  }

  void write(const char* data, size_t size) override {
    if (std::fwrite(data, 1, size, file_) != size)
      throw Error(path_, std::string("write failed: ") + std::strerror(errno));
    bytes_ += size;
  }

  void close() {
    if (file_ != nullptr) {
      std::fflush(file_);
      ::fsync(fileno(file_));
      std::fclose(file_);
      file_ = nullptr;
    }
  }

  bool started() const { return file_ != nullptr || bytes_ > 0; }
  bool resumed() const { return resumed_; }
  uint64_t bytes() const { return bytes_; }

 private:
  std::string path_;
  uint64_t offset_;
  std::string where_;
  FILE* file_ = nullptr;
  bool resumed_ = false;
  uint64_t bytes_ = 0;
};

}  // namespace

FetchResult download_file(HttpClient& client, const TargetDir& target, const DownloadJob& job,
                          const RetryPolicy& policy) {
  const std::string where = job.origin + ": file '" + job.name + "'";
  FetchResult result;
  result.path = target.resolve(job.name, job.origin);
  if (local_file_matches(result.path, job.expected)) {
    result.outcome = FetchOutcome::UpToDate;
    result.size = uint64_t(file_size(result.path));
    return result;
  }
  std::string partial = target.partial_path(job.name, job.version_tag);
  ::mkdir((target.root() + "/.ktune-download").c_str(), 0755);

  ExpectedContent expected = job.expected;  // adjusted by what the store's responses say
  bool any_resume = false;
  bool restarted_after_mismatch = false;
  for (int attempt = 1;; ++attempt) {
    int64_t have = file_size(partial);
    if (have < 0) have = 0;
    if (job.expected.size >= 0 && have > job.expected.size) {  // longer than the file: useless
      ::unlink(partial.c_str());
      have = 0;
    }
    bool complete_partial = job.expected.size >= 0 && have == job.expected.size && have > 0;
    if (complete_partial) any_resume = true;
    if (!complete_partial) {
      HttpRequest request = job.make_request(uint64_t(have));
      if (have > 0) request.headers.emplace_back("Range", "bytes=" + std::to_string(have) + "-");
      PartialFileSink sink(partial, uint64_t(have), where);
      HttpResponse response;
      try {
        response = client.perform(request, &sink);
      } catch (const TransportError& e) {
        sink.close();
        result.bytes_transferred += sink.bytes();
        if (!e.retryable() || attempt >= policy.max_attempts)
          throw Error(where, std::string(e.what_only()) + " (after " + std::to_string(attempt) +
                                 " attempts; the partial file is kept for a resume)");
        double delay = retry_delay_seconds(policy, attempt, nullptr);
        log_warn(where + ": " + e.what_only() + "; retrying from byte " + std::to_string(have + int64_t(sink.bytes())) +
                 " in " + std::to_string(delay).substr(0, 4) + " s (attempt " + std::to_string(attempt + 1) + "/" +
                 std::to_string(policy.max_attempts) + ")");
        sleep_seconds(delay);
        continue;
      }
      sink.close();
      result.bytes_transferred += sink.bytes();
      if (response.status == 416 && have > 0) {  // our partial is not a prefix the server knows
        ::unlink(partial.c_str());
        continue;
      }
      if (response.status < 200 || response.status >= 300) {
        if (is_retryable_status(response.status) && attempt < policy.max_attempts) {
          double delay = retry_delay_seconds(policy, attempt, &response);
          log_warn(where + ": HTTP " + std::to_string(response.status) + "; retrying in " +
                   std::to_string(delay).substr(0, 4) + " s (attempt " + std::to_string(attempt + 1) + "/" +
                   std::to_string(policy.max_attempts) + ")");
          sleep_seconds(delay);
          continue;
        }
        job.explain_error(response);
        throw Error(where, "HTTP " + std::to_string(response.status));
      }
      if (response.status == 200 && file_size(partial) < 0) {  // an empty body
        std::FILE* f = std::fopen(partial.c_str(), "wb");
        if (f) std::fclose(f);
      }
      any_resume = any_resume || sink.resumed();
      if (job.adjust_expected) job.adjust_expected(response, expected);
    }
    std::string problem = first_mismatch(partial, expected);
    if (!problem.empty()) {
      ::unlink(partial.c_str());
      // A stale or corrupt partial from before may be to blame: one clean download more.
      if ((have > 0 || complete_partial) && !restarted_after_mismatch) {
        restarted_after_mismatch = true;
        any_resume = false;
        continue;
      }
      throw Error(where, "downloaded content does not match the store's record: " + problem +
                             " (the partial file was removed)");
    }
    break;
  }
  target.commit(partial, result.path, job.origin);
  result.size = uint64_t(file_size(result.path));
  result.outcome = any_resume ? FetchOutcome::Resumed : FetchOutcome::Downloaded;
  return result;
}

// Bytes download_file still writes for `job` (see check_room_for).
static uint64_t bytes_to_fetch(const TargetDir& target, const DownloadJob& job) {
  if (job.expected.size < 0) return 0;
  if (file_size(target.resolve(job.name, job.origin)) == job.expected.size) return 0;  // in place (checked later)
  const int64_t have = std::max<int64_t>(0, file_size(target.partial_path(job.name, job.version_tag)));
  return uint64_t(std::max<int64_t>(0, job.expected.size - have));
}

void check_room_for(const TargetDir& target, const std::vector<DownloadJob>& jobs, const std::string& origin) {
  std::vector<uint64_t> to_write;
  for (const DownloadJob& job : jobs) to_write.push_back(bytes_to_fetch(target, job));
  target.check_room(to_write, origin);
}

void download_all(HttpClient& client, const TargetDir& target, const std::vector<DownloadJob>& jobs,
                  const RetryPolicy& policy, const std::string& origin, TransferReport& report,
                  const ProgressFn& progress) {
  check_room_for(target, jobs, origin);
  for (size_t i = 0; i < jobs.size(); ++i) {
    FetchResult fr = download_file(client, target, jobs[i], policy);
    report.bytes_transferred += fr.bytes_transferred;
    report.files.push_back({jobs[i].name, fr.size, fr.outcome});
    if (progress) progress(i + 1, jobs.size(), report.files.back());
  }
  target.remove_partial_dir_if_empty();
}

}  // namespace ktune::hub
