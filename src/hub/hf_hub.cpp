#include "hub/hf_hub.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/log.h"
#include "hub/digest.h"
#include "hub/file_download.h"

namespace ktune::hub {

using nlohmann::json;

HfRepoType parse_hf_repo_type(const std::string& text) {
  if (text == "model" || text == "models") return HfRepoType::Model;
  if (text == "dataset" || text == "datasets") return HfRepoType::Dataset;
  throw Error("--repo-type " + text, "expected 'model' or 'dataset'");
}

static const char* type_word(HfRepoType type) { return type == HfRepoType::Dataset ? "dataset" : "model"; }

std::string hf_endpoint_from_env() {
  const char* env = std::getenv("HF_ENDPOINT");
  std::string e = env != nullptr && *env != '\0' ? env : "https://huggingface.co";
  while (!e.empty() && e.back() == '/') e.pop_back();
  return e;
}

HfHubClient::HfHubClient(HfOptions options) : options_(std::move(options)) {
  if (options_.endpoint.empty()) options_.endpoint = hf_endpoint_from_env();
  while (!options_.endpoint.empty() && options_.endpoint.back() == '/') options_.endpoint.pop_back();
  if (!options_.token.empty()) register_secret(options_.token);
}

Headers HfHubClient::auth_headers() const {
  Headers h;
  if (!options_.token.empty()) h.emplace_back("Authorization", "Bearer " + options_.token);
  return h;
}

std::string HfHubClient::api_base(const std::string& repo_id, HfRepoType type) const {
  return options_.endpoint + "/api/" + (type == HfRepoType::Dataset ? "datasets/" : "models/") +
         url_encode(repo_id, true);
}

std::string HfHubClient::repo_url(const std::string& repo_id, HfRepoType type) const {
  return options_.endpoint + "/" + (type == HfRepoType::Dataset ? "datasets/" : "") + url_encode(repo_id, true);
}

// The Hub's own explanation: X-Error-Message, else a JSON body's "error", else the body's start.
static std::string server_message(const HttpResponse& r) {
  std::string m = r.header("x-error-message");
  if (!m.empty()) return m;
  try {
    json j = json::parse(r.body);
    if (j.is_object() && j.contains("error") && j["error"].is_string()) return j["error"].get<std::string>();
  } catch (...) {
  }
  std::string body = r.body.substr(0, 200);
  for (char& c : body)
    if (c == '\n' || c == '\r') c = ' ';
  return body;
}

void HfHubClient::raise(const HttpResponse& r, const std::string& where, const std::string& repo_id,
                        HfRepoType type) const {
  const std::string code = r.header("x-error-code");
  const std::string message = server_message(r);
  const std::string status = "HTTP " + std::to_string(r.status);
  const bool has_token = !options_.token.empty();
  const std::string page = repo_url(repo_id, type);
  std::string text;
  if (code == "GatedRepo") {
    text = has_token ? "gated " + std::string(type_word(type)) +
                           ": this access token has not been granted access; accept the conditions at " + page +
                           " with the account the token belongs to (" + status + ")"
                     : "gated " + std::string(type_word(type)) +
                           ": it needs an access token of an account that accepted its conditions at " + page +
                           "; pass --hf-token or set HF_TOKEN / ACCESS_TOKEN (" + status + ")";
  } else if (code == "RepoNotFound" || (r.status == 404 && code.empty() && where.find("file '") == std::string::npos)) {
    text = std::string("no such ") + type_word(type) + " repo '" + repo_id + "' on " + options_.endpoint +
           (has_token ? " (or it is private and this token cannot see it)"
                      : " (or it is private: pass --hf-token or set HF_TOKEN)") +
           (type == HfRepoType::Model ? "; for a dataset use --repo-type dataset" : "") + " (" + status + ")";
  } else if (code == "RevisionNotFound") {
    text = "no such revision (" + status + "): " + message;
  } else if (code == "EntryNotFound" || r.status == 404) {
    text = "no such file in the repo (" + status + "): " + message;
  } else if (r.status == 401) {
    text = has_token ? "the Hub rejected the access token (invalid or expired) (" + status + "): " + message
                     : "the Hub requires authentication; pass --hf-token or set HF_TOKEN (" + status + "): " + message;
  } else if (r.status == 403) {
    text = "access forbidden (" + status + "): " + message;
  } else {
    text = status + ": " + message;
  }
  throw Error(where, redact(text));
}

HfRepoInfo HfHubClient::repo_info(const std::string& repo_id, HfRepoType type, const std::string& revision) {
  const std::string where = "hf://" + repo_id + "@" + revision;
  const std::string url = api_base(repo_id, type) + "/revision/" + url_encode(revision, false) + "?blobs=true";
  HttpResponse r = perform_with_retries(
      http_, [&] { return HttpRequest{"GET", url, auth_headers()}; }, options_.retry, where);
  if (r.status != 200) raise(r, where, repo_id, type);
  HfRepoInfo info;
  info.repo_id = repo_id;
  info.type = type;
  json j;
  try {
    j = json::parse(r.body);
    info.sha = j.value("sha", std::string());
    for (const json& s : j.at("siblings")) {
      HfSibling sib;
      sib.path = s.at("rfilename").get<std::string>();
      if (s.contains("size") && s["size"].is_number_integer()) sib.size = s["size"].get<int64_t>();
      if (s.contains("blobId") && s["blobId"].is_string()) sib.blob_id = s["blobId"].get<std::string>();
      if (s.contains("lfs") && s["lfs"].is_object()) {
        const json& lfs = s["lfs"];
        sib.lfs_sha256 = lfs.value("sha256", std::string());
        if (lfs.contains("size") && lfs["size"].is_number_integer()) sib.size = lfs["size"].get<int64_t>();
      }
      info.siblings.push_back(std::move(sib));
    }
  } catch (const json::exception& e) {
    throw Error(where, std::string("unexpected answer from the Hub's revision API: ") + e.what());
  }
  if (info.sha.empty()) info.sha = revision;
  return info;
}

static bool under_subpath(const std::string& path, const std::string& subpath) {
  if (subpath.empty()) return true;
  return path == subpath || (path.size() > subpath.size() && path.compare(0, subpath.size(), subpath) == 0 &&
                             path[subpath.size()] == '/');
}

TransferReport HfHubClient::download(const std::string& repo_id, HfRepoType type, const std::string& revision,
                                     const std::string& subpath, const PatternFilter& filter,
                                     const std::string& output_dir, const ProgressFn& progress) {
  auto t0 = std::chrono::steady_clock::now();
  HfRepoInfo info = repo_info(repo_id, type, revision);
  const std::string origin = "hf://" + repo_id;
  TargetDir target(output_dir);
  RemoveCreatedDirsOnThrow cleanup(target);

  std::vector<const HfSibling*> chosen;
  for (const HfSibling& s : info.siblings)
    if (under_subpath(s.path, subpath) && filter.keeps(s.path)) chosen.push_back(&s);
  // Every name is checked before the first byte is written: one bad name refuses the whole repo.
  for (const HfSibling* s : chosen) target.resolve(s->path, origin);
  if (chosen.empty())
    throw Error(origin + (subpath.empty() ? "" : "/" + subpath),
                "no file of the repo (" + std::to_string(info.siblings.size()) +
                    " listed) is under that path and passes the allow/ignore patterns");

  TransferReport report;
  report.source = origin + (subpath.empty() ? "" : "/" + subpath);
  report.destination = target.root();
  report.revision = info.sha;
  const std::string base = repo_url(repo_id, type) + "/resolve/" + url_encode(info.sha, false) + "/";
  std::vector<DownloadJob> jobs;
  for (const HfSibling* sibling : chosen) {
    const HfSibling& s = *sibling;
    DownloadJob& job = jobs.emplace_back();
    job.origin = origin;
    job.name = s.path;
    job.expected.size = s.size;
    if (!s.lfs_sha256.empty()) {
      job.expected.sha256 = s.lfs_sha256;
      job.version_tag = s.lfs_sha256;
    } else {
      job.expected.git_sha1 = s.blob_id;
      job.version_tag = s.blob_id.empty() ? info.sha : s.blob_id;
    }
    const std::string url = base + url_encode(s.path, true);
    job.make_request = [this, url](uint64_t) { return HttpRequest{"GET", url, auth_headers()}; };
    const std::string where = origin + ": file '" + s.path + "'";
    job.explain_error = [this, where, repo_id, type](const HttpResponse& r) { raise(r, where, repo_id, type); };
  }
  download_all(http_, target, jobs, options_.retry, report.source, report, progress);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

// ---- upload -------------------------------------------------------------------------------

static std::string read_prefix(const std::string& path, size_t n) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path, "cannot open the file to upload");
  std::string s(n, '\0');
  f.read(s.data(), std::streamsize(n));
  s.resize(size_t(f.gcount()));
  return s;
}

static std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path, "cannot open the file to upload");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

static uint64_t size_of(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw Error(path, "cannot stat the file to upload");
  return uint64_t(st.st_size);
}

void HfHubClient::ensure_repo(const std::string& repo_id, HfRepoType type) {
  const std::string where = "hf://" + repo_id;
  const std::string url = api_base(repo_id, type);
  HttpResponse r = perform_with_retries(
      http_, [&] { return HttpRequest{"GET", url, auth_headers()}; }, options_.retry, where);
  if (r.status == 200) return;
  bool missing = r.status == 404 || r.header("x-error-code") == "RepoNotFound";
  if (!missing) raise(r, where, repo_id, type);
  size_t slash = repo_id.find('/');
  json body = {{"name", slash == std::string::npos ? repo_id : repo_id.substr(slash + 1)},
               {"type", type_word(type)},
               {"private", true}};
  if (slash != std::string::npos) body["organization"] = repo_id.substr(0, slash);
  Headers h = auth_headers();
  h.emplace_back("Content-Type", "application/json");
  HttpResponse c = perform_with_retries(
      http_, [&] { return HttpRequest{"POST", options_.endpoint + "/api/repos/create", h, body.dump()}; },
      options_.retry, where + ": create repo");
  if (c.status != 200 && c.status != 201 && c.status != 409) raise(c, where + ": create repo", repo_id, type);
  log_info("created private " + std::string(type_word(type)) + " repo " + where);
}

std::string HfHubClient::upload(const std::string& repo_id, HfRepoType type, const std::string& revision,
                                const std::vector<UploadItem>& files, const std::string& commit_message,
                                const ProgressFn& progress) {
  const std::string where = "hf://" + repo_id;
  if (options_.token.empty()) throw Error(where, "uploading to the Hub needs an access token (--hf-token or HF_TOKEN)");
  for (const UploadItem& f : files) check_relative_name(f.remote_path, where);
  ensure_repo(repo_id, type);
  const std::string rev = url_encode(revision, false);
  Headers json_headers = auth_headers();
  json_headers.emplace_back("Content-Type", "application/json");

  // 1. preupload: which files go through LFS.
  json pre = {{"files", json::array()}};
  std::vector<uint64_t> sizes;
  for (const UploadItem& f : files) {
    sizes.push_back(size_of(f.local_path));
    pre["files"].push_back(
        {{"path", f.remote_path}, {"size", sizes.back()}, {"sample", base64_encode(read_prefix(f.local_path, 512))}});
  }
  HttpResponse pr = perform_with_retries(
      http_, [&] { return HttpRequest{"POST", api_base(repo_id, type) + "/preupload/" + rev, json_headers, pre.dump()}; },
      options_.retry, where + ": preupload");
  if (pr.status != 200) raise(pr, where + ": preupload", repo_id, type);
  std::vector<bool> is_lfs(files.size(), false);
  try {
    json answer = json::parse(pr.body);
    for (const json& f : answer.at("files")) {
      std::string path = f.at("path").get<std::string>();
      for (size_t i = 0; i < files.size(); ++i)
        if (files[i].remote_path == path) is_lfs[i] = f.value("uploadMode", std::string("regular")) == "lfs";
    }
  } catch (const json::exception& e) {
    throw Error(where, std::string("unexpected preupload answer: ") + e.what());
  }

  // 2. LFS objects: batch (basic transfer), PUT each, verify.
  std::vector<std::string> oids(files.size());
  json objects = json::array();
  for (size_t i = 0; i < files.size(); ++i) {
    if (!is_lfs[i]) continue;
    oids[i] = sha256_file_hex(files[i].local_path);
    objects.push_back({{"oid", oids[i]}, {"size", sizes[i]}});
  }
  if (!objects.empty()) {
    json batch = {{"operation", "upload"}, {"transfers", json::array({"basic"})}, {"objects", objects}, {"hash_algo", "sha256"}};
    Headers lfs_headers = auth_headers();
    lfs_headers.emplace_back("Accept", "application/vnd.git-lfs+json");
    lfs_headers.emplace_back("Content-Type", "application/vnd.git-lfs+json");
    const std::string batch_url = repo_url(repo_id, type) + ".git/info/lfs/objects/batch";
    HttpResponse br = perform_with_retries(
        http_, [&] { return HttpRequest{"POST", batch_url, lfs_headers, batch.dump()}; }, options_.retry,
        where + ": LFS batch");
    if (br.status != 200) raise(br, where + ": LFS batch", repo_id, type);
    json answer;
    try {
      answer = json::parse(br.body);
    } catch (const json::exception& e) {
      throw Error(where, std::string("unexpected LFS batch answer: ") + e.what());
    }
    for (const json& obj : answer.value("objects", json::array())) {
      std::string oid = obj.value("oid", std::string());
      size_t i = 0;
      while (i < files.size() && oids[i] != oid) ++i;
      if (i == files.size()) continue;
      if (obj.contains("error"))
        throw Error(where + ": file '" + files[i].remote_path + "'", "LFS upload refused: " + obj["error"].dump());
      if (!obj.contains("actions") || !obj["actions"].contains("upload")) continue;  // already stored
      const json& up = obj["actions"]["upload"];
      Headers put_headers;
      const json up_header = up.value("header", json::object());  // kept alive for the loop
      for (auto& [k, v] : up_header.items()) {
        if (k == "chunk_size" || (k.size() > 0 && std::isdigit(static_cast<unsigned char>(k[0]))))
          throw Error(where + ": file '" + files[i].remote_path + "'",
                      "the Hub asked for a multipart LFS transfer, which ktune does not implement");
        put_headers.emplace_back(k, v.get<std::string>());
      }
      HttpRequest put{"PUT", up.at("href").get<std::string>(), put_headers};
      put.upload_path = files[i].local_path;
      HttpResponse ur = perform_with_retries(http_, [&] { return put; }, options_.retry,
                                             where + ": file '" + files[i].remote_path + "'");
      if (ur.status < 200 || ur.status >= 300)
        throw Error(where + ": file '" + files[i].remote_path + "'",
                    "LFS storage refused the upload: HTTP " + std::to_string(ur.status) + ": " + server_message(ur));
      if (obj["actions"].contains("verify")) {
        const json& ver = obj["actions"]["verify"];
        Headers vh;
        const json ver_header = ver.value("header", json::object());
        for (auto& [k, v] : ver_header.items()) vh.emplace_back(k, v.get<std::string>());
        std::string vurl = ver.at("href").get<std::string>();
        if (url_origin(vurl) == url_origin(options_.endpoint))
          for (const auto& h : auth_headers()) vh.push_back(h);
        vh.emplace_back("Content-Type", "application/vnd.git-lfs+json");
        json vbody = {{"oid", oids[i]}, {"size", sizes[i]}};
        HttpResponse vr = perform_with_retries(
            http_, [&] { return HttpRequest{"POST", vurl, vh, vbody.dump()}; }, options_.retry, where + ": LFS verify");
        if (vr.status < 200 || vr.status >= 300) raise(vr, where + ": LFS verify", repo_id, type);
      }
    }
  }

  // 3. the commit: one NDJSON line per file.
  std::string ndjson = json({{"key", "header"}, {"value", {{"summary", commit_message}, {"description", ""}}}}).dump() + "\n";
  for (size_t i = 0; i < files.size(); ++i) {
    json line;
    if (is_lfs[i]) {
      line = {{"key", "lfsFile"},
              {"value", {{"path", files[i].remote_path}, {"algo", "sha256"}, {"oid", oids[i]}, {"size", sizes[i]}}}};
    } else {
      line = {{"key", "file"},
              {"value",
               {{"path", files[i].remote_path}, {"encoding", "base64"},
                {"content", base64_encode(read_all(files[i].local_path))}}}};
    }
    ndjson += line.dump() + "\n";
  }
  Headers commit_headers = auth_headers();
  commit_headers.emplace_back("Content-Type", "application/x-ndjson");
  HttpResponse cr = perform_with_retries(
      http_, [&] { return HttpRequest{"POST", api_base(repo_id, type) + "/commit/" + rev, commit_headers, ndjson}; },
      options_.retry, where + ": commit");
  if (cr.status != 200 && cr.status != 201) raise(cr, where + ": commit", repo_id, type);
  std::string commit;
  try {
    commit = json::parse(cr.body).value("commitOid", std::string());
  } catch (const json::exception&) {
  }
  for (size_t i = 0; i < files.size(); ++i)
    if (progress) progress(i + 1, files.size(), {files[i].remote_path, sizes[i], FetchOutcome::Downloaded});
  return commit;
}

}  // namespace ktune::hub
