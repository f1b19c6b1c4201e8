// `ktune jobs list|get|logs|wait|delete`: the TrainJobs of the backend (local by default: the SQLite
// registry under $KTUNE_HOME), from any shell, through TrainerClient. Also `ktune jobs supervise`,
// the local backend's detached supervisor (started by `ktune train`, not meant to be typed).
// Exit codes: 0 success; 1 error or (wait) the job Failed; 2 usage; 3 (wait) timeout.
// It deliberately formats only: every decision is TrainerClient's or the backend's.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "cli/job_wait.h"
#include "core/error.h"
#include "sdk/local_backend.h"
#include "sdk/process_identity.h"
#include "sdk/trainer_client.h"

namespace ktune::cli {

namespace {

int jobs_usage(FILE* to) {
  std::fprintf(to,
               "usage: ktune jobs list [--runtime NAME]\n"
               "       ktune jobs get NAME\n"
               "       ktune jobs logs NAME [-f|--follow] [--step STEP]     (STEP default node-0)\n"
               "       ktune jobs wait NAME [--status S[,S...]] [--timeout SECONDS] [--interval SECONDS]\n"
               "       ktune jobs events NAME                               (Kubernetes: the cluster's events about it)\n"
               "       ktune jobs delete NAME [--workspace]                 (--workspace: remove its files too)\n"
               "  statuses: Created, Running, Complete, Failed. Backend: KTUNE_BACKEND (local), KTUNE_HOME (~/.ktune)\n"
               "  or --backend kubernetes [--namespace NS] [--kubeconfig PATH] [--context NAME] (KUBECONFIG,\n"
               "  ~/.kube/config or the in-cluster service account; KTUNE_NAMESPACE)\n");
  return to == stdout ? 0 : 2;
}

std::string duration_text(double seconds) {
  if (seconds < 0) return "-";
  long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof(buf), "%ldh%02ldm%02lds", s / 3600, (s / 60) % 60, s % 60);
  else if (s >= 60) std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof(buf), "%lds", s);
  return buf;
}

std::string progress_text(const sdk::JobProgress& p) {
  if (!p.present) return "-";
  char buf[64];
  if (p.progress_percentage >= 0) std::snprintf(buf, sizeof(buf), "%.0f%% (%ld/%ld)", p.progress_percentage, p.step, p.total_steps);
  else std::snprintf(buf, sizeof(buf), "step %ld", p.step);
  return buf;
}

std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], row[c].size());
    }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

// "NAME --flag value -f" -> positional NAME and the flags; `boolean` flags take no value.
struct Parsed {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
};
Parsed parse(const Args& args, size_t from, const std::set<std::string>& boolean, const std::set<std::string>& valued) {
  Parsed p;
  for (size_t i = from; i < args.size(); ++i) {
    std::string a = args[i];
    if (a.size() > 1 && a[0] == '-') {
      std::string value;
      size_t eq = a.find('=');
      if (eq != std::string::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
      }
      if (boolean.count(a)) {
        p.flags[a] = "1";
      } else if (valued.count(a)) {
        if (eq == std::string::npos) {
          if (i + 1 >= args.size()) throw Error("ktune jobs " + args[0] + " " + a, "needs a value");
          value = args[++i];
        }
        p.flags[a] = value;
      } else {
        throw Error("ktune jobs " + args[0], "unknown flag " + a);
      }
    } else {
      p.positional.push_back(a);
    }
  }
  return p;
}

std::string one_name(const Parsed& p, const std::string& sub) {
  if (p.positional.size() != 1) throw Error("ktune jobs " + sub, "expects exactly one job name");
  return p.positional[0];
}

int jobs_list(sdk::TrainerClient& client, const Args& args) {
  Parsed p = parse(args, 1, {}, {"--runtime"});
  std::vector<std::vector<std::string>> rows = {{"NAME", "STATUS", "RUNTIME", "STEPS", "PROGRESS", "CREATED", "AGE"}};
  const double now = sdk::unix_now();
  for (const sdk::TrainJobRecord& j : client.backend().list_jobs(p.flags.count("--runtime") ? p.flags["--runtime"] : "")) {
    int done = 0;
    for (const sdk::StepRecord& s : j.steps) done += s.status == sdk::kComplete;
    rows.push_back({j.name, j.status, j.runtime, std::to_string(done) + "/" + std::to_string(j.steps.size()),
                    progress_text(j.progress), sdk::rfc3339(j.created_at), duration_text(now - j.created_at)});
  }
  if (rows.size() == 1) {
    std::printf("no TrainJobs\n");
    return 0;
  }
  std::fputs(table(rows).c_str(), stdout);
  return 0;
}

int jobs_get(sdk::TrainerClient& client, const Args& args) {
  Parsed p = parse(args, 1, {}, {});
  sdk::TrainJobRecord j = client.get_job_record(one_name(p, "get"));
  const double now = sdk::unix_now();
  std::printf("Name:        %s\n", j.name.c_str());
  std::printf("Runtime:     %s\n", j.runtime.c_str());
  std::printf("Trainer:     %s%s%s\n", j.trainer_type.c_str(), j.recipe.empty() ? "" : ("  recipe " + j.recipe).c_str(),
              j.config.empty() ? "" : ("  config " + j.config).c_str());
  std::printf("Nodes:       %d x %d process(es)\n", j.num_nodes, j.num_proc_per_node);
  std::printf("Status:      %s%s\n", j.status.c_str(), j.reason.empty() ? "" : ("  (" + j.reason + ")").c_str());
  std::printf("Created:     %s\n", sdk::rfc3339(j.created_at).c_str());
  if (j.started_at > 0)
    std::printf("Duration:    %s\n", duration_text((j.finished_at > 0 ? j.finished_at : now) - j.started_at).c_str());
  if (!j.workspace.empty()) std::printf("Workspace:   %s\n", j.workspace.c_str());
  if (j.progress.present) {
    const sdk::JobProgress& pr = j.progress;
    std::printf("Progress:    %s  epoch %g  ETA %s\n", progress_text(pr).c_str(), pr.epoch,
                duration_text(pr.estimated_remaining_seconds).c_str());
    std::string metrics;
    for (const auto& [k, v] : pr.metrics) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), "%s%s=%.6g", metrics.empty() ? "" : "  ", k.c_str(), v);
      metrics += buf;
    }
    if (!metrics.empty()) std::printf("Metrics:     %s\n", metrics.c_str());
  } else {
    std::printf("Progress:    -\n");
  }
  std::vector<std::vector<std::string>> rows = {{"STEP", "STATUS", "DEVICE", "COUNT", "PID", "EXIT", "DURATION", "LOG"}};
  for (const sdk::StepRecord& s : j.steps) {
    std::string duration = s.started_at > 0 ? duration_text((s.finished_at > 0 ? s.finished_at : now) - s.started_at) : "-";
    rows.push_back({s.name, s.status, s.device, s.device_count, s.pid > 0 ? std::to_string(s.pid) : "-",
                    s.exit_code >= 0 ? std::to_string(s.exit_code) : "-", duration,
                    s.pod_name.empty() ? s.log_path : "pod/" + s.pod_name});
  }
  std::printf("\n%s", table(rows).c_str());
  if (!j.exports.empty()) {
    std::vector<std::vector<std::string>> ex = {{"EXPORT", "STATUS", "PARTS", "FILES", "BYTES", "FINISHED", "DESTINATION"}};
    for (const sdk::ExportRecord& e : j.exports) {
      std::string files = "-", bytes = "-";
      if (!e.summary_json.empty()) {
        const nlohmann::json summary = nlohmann::json::parse(e.summary_json, nullptr, false);
        if (summary.is_object()) {
          files = std::to_string(summary.value("file_count", 0));
          bytes = std::to_string(summary.value("bytes", 0LL));
        }
      }
      ex.push_back({std::to_string(e.id), e.status + (e.error.empty() ? "" : " (" + e.error + ")"), e.parts, files,
                    bytes, e.finished_at > 0 ? sdk::rfc3339(e.finished_at) : "-", e.destination});
    }
    std::printf("\n%s", table(ex).c_str());
  }
  return 0;
}

int jobs_logs(sdk::TrainerClient& client, const Args& args) {
  Parsed p = parse(args, 1, {"-f", "--follow"}, {"--step"});
  const bool follow = p.flags.count("-f") || p.flags.count("--follow");
  const std::string step = p.flags.count("--step") ? p.flags["--step"] : "node-0";
  client.get_job_logs(one_name(p, "logs"), step, follow, [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    return true;
  });
  return 0;
}

int jobs_wait(sdk::TrainerClient& client, const Args& args) {
  Parsed p = parse(args, 1, {}, {"--status", "--timeout", "--interval"});
  const std::string name = one_name(p, "wait");
  std::set<std::string> statuses;
  std::stringstream list(p.flags.count("--status") ? p.flags["--status"] : "Complete");
  for (std::string s; std::getline(list, s, ',');)
    if (!s.empty()) statuses.insert(s);
  const double timeout = p.flags.count("--timeout") ? std::atof(p.flags["--timeout"].c_str()) : 600;
  const double interval = p.flags.count("--interval") ? std::atof(p.flags["--interval"].c_str()) : std::min(2.0, timeout / 4);
  return wait_exit_code(client, name, statuses, timeout, interval,
                        [](const types::TrainJob& j) { std::printf("%s %s\n", j.name.c_str(), j.status.c_str()); });
}

// The cluster's events about the job, as kubectl get events lists them (Kubernetes backend only).
int jobs_events(sdk::TrainerClient& client, const Args& args) {
  Parsed p = parse(args, 1, {}, {});
  std::vector<std::vector<std::string>> rows = {{"TIME", "KIND", "NAME", "REASON", "MESSAGE"}};
  for (const types::Event& e : client.get_job_events(one_name(p, "events")))
    rows.push_back({e.event_time, e.involved_object_kind, e.involved_object_name, e.reason, e.message});
  std::printf("%s", table(rows).c_str());
  return 0;
}

int jobs_delete(sdk::TrainerClient& client, const Args& args) {
  Parsed p = parse(args, 1, {"--workspace"}, {});
  const std::string name = one_name(p, "delete");
  client.delete_job(name, p.flags.count("--workspace") > 0);
  std::printf("deleted %s\n", name.c_str());
  return 0;
}

}  // namespace

int run_jobs(sdk::TrainerClient& client, const Args& args);

int cmd_jobs(const Args& args) {
  if (args.empty()) return jobs_usage(stderr);
  const std::string& sub = args[0];
  if (is_help_flag(sub) || sub == "help") return jobs_usage(stdout);
  // The supervisor needs no catalog and no client: it runs one job from the registry.
  if (sub == "supervise") return sdk::supervise_command(Args(args.begin() + 1, args.end()));
  // The backend flags may come anywhere after the subcommand.
  sdk::BackendConfig config = sdk::BackendConfig::from_env();
  Args rest;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    const size_t eq = flag.find('=');
    if (eq != std::string::npos) flag = flag.substr(0, eq);
    if (i == 0 || !sdk::BackendConfig::is_flag(flag)) {
      rest.push_back(args[i]);
      continue;
    }
    if (eq != std::string::npos) value = args[i].substr(eq + 1);
    else if (i + 1 < args.size()) value = args[++i];
    else throw Error("ktune jobs " + flag, "needs a value");
    config.apply_flag(flag, value);
  }
  sdk::TrainerClient client(config);
  return run_jobs(client, rest);
}

int run_jobs(sdk::TrainerClient& client, const Args& args) {
  const std::string& sub = args[0];
  if (sub == "list" || sub == "ls") return jobs_list(client, args);
  if (sub == "get") return jobs_get(client, args);
  if (sub == "logs") return jobs_logs(client, args);
  if (sub == "wait") return jobs_wait(client, args);
  if (sub == "events") return jobs_events(client, args);
  if (sub == "delete" || sub == "rm") return jobs_delete(client, args);
  std::fprintf(stderr, "ktune jobs: unknown subcommand '%s'\n", sub.c_str());
  return jobs_usage(stderr);
}

}  // namespace ktune::cli
