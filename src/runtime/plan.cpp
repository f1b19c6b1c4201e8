// TrainJobPlan's printing (`ktune train --dry-run`) and its re-rooting onto a local workspace.
// Commands print shell-quoted, so a printed line can be pasted into a shell; secret env values
// print as ***. It does not run anything.
#include "runtime/plan.h"

#include <cctype>
#include <sstream>

namespace ktune {

namespace {

std::string shell_quote(const std::string& s) {
  if (s.empty()) return "''";
  bool plain = true;
  for (char c : s) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == '/' ||
                    c == '=' || c == ':' || c == ',' || c == '+' || c == '@' || c == '%';
    if (!ok) plain = false;
  }
  if (plain) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string join_command(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) out += (out.empty() ? "" : " ") + shell_quote(a);
  return out;
}

// Replaces `root` where it stands as a whole path component at the start of a path: preceded by
// the start, '=', ':', ',', '[', ' ', a quote or '{', and followed by the end, '/', or one of those.
std::string reroot(const std::string& text, const std::string& root, const std::string& dir) {
  if (root.empty()) return text;
  auto is_before = [](char c) {
    return c == '=' || c == ':' || c == ',' || c == '[' || c == ' ' || c == '\'' || c == '"' || c == '{';
  };
  auto is_after = [](char c) {
    return c == '/' || c == ',' || c == ']' || c == ' ' || c == '\'' || c == '"' || c == '}' || c == ':';
  };
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t at = text.find(root, i);
    if (at == std::string::npos) {
      out.append(text, i, std::string::npos);
      break;
    }
    const size_t end = at + root.size();
    const bool starts = at == 0 || is_before(text[at - 1]);
    const bool ends = end == text.size() || is_after(text[end]);
    out.append(text, i, at - i);
    out += starts && ends ? dir : root;
    i = end;
  }
  return out;
}

}  // namespace

std::string TrainJobPlan::to_text() const {
  std::ostringstream o;
  o << "TrainJob " << job_name << "  runtime " << runtime_name << "  (" << trainer_type
    << (framework.empty() ? "" : ", " + framework) << ")\n";
  if (!model_key.empty()) o << "  model     " << model_key << "\n";
  if (!recipe.empty()) o << "  recipe    " << recipe << "\n";
  if (!config.empty()) o << "  config    " << config << "\n";
  o << "  layout    " << num_nodes << (num_nodes == 1 ? " node" : " nodes") << " x " << num_proc_per_node
    << (num_proc_per_node == 1 ? " process" : " processes") << "\n";
  o << "  workspace " << workspace << "\n";
  o << "steps:\n";
  for (size_t i = 0; i < steps.size(); ++i) {
    const PlanStep& s = steps[i];
    o << "  " << (i + 1) << ". " << s.name;
    if (s.node_rank >= 0) o << "  (rank " << s.node_rank << ", " << s.num_proc << (s.num_proc == 1 ? " process" : " processes") << ")";
    if (!s.depends_on.empty()) {
      o << "  after ";
      for (size_t k = 0; k < s.depends_on.size(); ++k) o << (k ? ", " : "") << s.depends_on[k];
    }
    o << "\n";
    if (!s.image.empty()) o << "       image:   " << s.image << "\n";
    o << "       command: " << (s.command.empty() ? std::string("(the image's entrypoint)") : join_command(s.command)) << "\n";
    if (!s.working_dir.empty()) o << "       workdir: " << s.working_dir << "\n";
    for (const auto& [k, v] : s.env) o << "       env:     " << k << "=" << v << "\n";
    for (const auto& [k, v] : s.secret_env) o << "       env:     " << k << "=***\n";
    if (s.container_port) o << "       port:    " << s.container_port << "\n";
    if (s.device != "Unknown") o << "       device:  " << s.device << " x " << s.device_count << "\n";
  }
  return o.str();
}

TrainJobPlan TrainJobPlan::with_workspace(const std::string& dir) const {
  TrainJobPlan p = *this;
  for (PlanStep& s : p.steps) {
    for (std::string& a : s.command) a = reroot(a, workspace, dir);
    for (auto& [k, v] : s.env) v = reroot(v, workspace, dir);
    s.working_dir = reroot(s.working_dir, workspace, dir);
  }
  p.workspace = dir;
  return p;
}

}  // namespace ktune
