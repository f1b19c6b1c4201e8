// Split expressions and file resolution (see data_source.h). The slice arithmetic copies HF
// datasets' arrow_reader.py (_SUB_SPEC_RE, _rel_to_abs_instr, _pct_to_abs_closest/_pct1); the
// split naming copies data_files.py's keyword lists.
#include "data/data_source.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fnmatch.h>

#include "core/error.h"

namespace fs = std::filesystem;

namespace ktune {

namespace {

bool is_word_char(char c) { return std::isalnum((unsigned char)c) || c == '_' || c == '-'; }

// Parses "-?\d+%?" at s[i]; returns false when there is no number.
bool parse_bound(const std::string& s, size_t& i, std::optional<int64_t>* value, bool* percent) {
  size_t start = i;
  if (i < s.size() && s[i] == '-') ++i;
  size_t digits = i;
  while (i < s.size() && std::isdigit((unsigned char)s[i])) ++i;
  if (i == digits) { i = start; return false; }
  try {
    *value = std::stoll(s.substr(start, i - start));
  } catch (const std::exception&) {
    throw Error("dataset.split", "number out of range in '" + s + "'");
  }
  if (i < s.size() && s[i] == '%') { *percent = true; ++i; }
  return true;
}

SplitSlice parse_one(const std::string& sub, const std::string& whole) {
  auto bad = [&](const std::string& why) {
    return Error("dataset.split", "cannot parse '" + whole + "': " + why +
                                      " (expected e.g. train, train[:95%], train[10:200], train[-10%:])");
  };
  SplitSlice slice;
  size_t i = 0;
  while (i < sub.size() && is_word_char(sub[i])) ++i;
  if (i == 0) throw bad("no split name");
  slice.split = sub.substr(0, i);
  bool from_pct = false, to_pct = false;
  if (i < sub.size() && sub[i] == '[') {
    ++i;
    parse_bound(sub, i, &slice.from, &from_pct);
    if (i >= sub.size() || sub[i] != ':') throw bad("a slice needs ':' between its bounds");
    ++i;
    parse_bound(sub, i, &slice.to, &to_pct);
    if (i >= sub.size() || sub[i] != ']') throw bad("unexpected text inside the brackets");
    ++i;
  }
  slice.percent = from_pct || to_pct;
  if (i < sub.size() && sub[i] == '(') {
    size_t close = sub.find(')', i);
    if (close == std::string::npos) throw bad("unclosed '('");
    std::string rounding = sub.substr(i + 1, close - i - 1);
    if (rounding == "pct1_dropremainder") slice.pct1_dropremainder = true;
    else if (rounding != "closest") throw bad("rounding must be closest or pct1_dropremainder, got '" + rounding + "'");
    if (!slice.percent) throw bad("rounding applies only to percent slices");
    i = close + 1;
  }
  if (i != sub.size()) throw bad("unexpected '" + sub.substr(i) + "'");
  if (slice.percent)
    for (const auto& b : {slice.from, slice.to})
      if (b && std::llabs(*b) > 100) throw bad("percent bounds must lie within -100% and 100%");
  return slice;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// HF datasets' split keywords (data_files.py).
const std::vector<std::pair<std::string, std::vector<std::string>>>& split_keywords() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> k = {
      {"train", {"train", "training"}},
      {"validation", {"validation", "valid", "dev", "val"}},
      {"test", {"test", "testing", "eval", "evaluation"}},
  };
  return k;
}

// The split a relative path names by one of its words (words are separated by -._ digits,
// spaces and '/'), or "" when it names none.
std::string split_of_path(const std::string& relative) {
  std::vector<std::string> words;
  std::string w;
  for (char c : relative) {
    if (c == '-' || c == '.' || c == '_' || c == ' ' || c == '/' || std::isdigit((unsigned char)c)) {
      if (!w.empty()) words.push_back(w);
      w.clear();
    } else {
      w += (char)std::tolower((unsigned char)c);
    }
  }
  if (!w.empty()) words.push_back(w);
  for (const auto& [split, keywords] : split_keywords())
    for (const std::string& k : keywords)
      if (std::find(words.begin(), words.end(), k) != words.end()) return split;
  return "";
}

bool hidden(const fs::path& relative) {
  for (const auto& part : relative) {
    std::string p = part.string();
    if (!p.empty() && (p[0] == '.' || p[0] == '_')) return true;
  }
  return false;
}

std::vector<std::string> list_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink)) {
    if (!entry.is_regular_file()) continue;
    if (hidden(fs::relative(entry.path(), dir))) continue;
    out.push_back(entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool has_wildcard(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// Files under `dir` matching the pattern's components parts[i..], as HF datasets resolves a
// data_files pattern (fsspec's glob): `*`, `?` and `[...]` within one path component, `**` any number
// of folders; hidden names (leading '.') only where the pattern spells the dot.
void glob_walk(const fs::path& dir, const std::vector<std::string>& parts, size_t i, std::vector<std::string>& out) {
  if (i == parts.size()) {
    if (fs::is_regular_file(dir)) out.push_back(dir.string());
    return;
  }
  const std::string& part = parts[i];
  if (!has_wildcard(part)) {
    glob_walk(dir / part, parts, i + 1, out);
    return;
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  std::vector<fs::path> entries;
  for (const auto& entry : fs::directory_iterator(dir, ec)) entries.push_back(entry.path());
  std::sort(entries.begin(), entries.end());
  if (part == "**") {
    if (i + 1 == parts.size()) {  // a trailing `**`: every file below
      for (const fs::path& e : entries)
        if (fs::is_regular_file(e) && e.filename().string()[0] != '.') out.push_back(e.string());
    } else {
      glob_walk(dir, parts, i + 1, out);  // no folder
    }
    for (const fs::path& e : entries)
      if (fs::is_directory(e) && e.filename().string()[0] != '.') glob_walk(e, parts, i, out);  // one more
    return;
  }
  for (const fs::path& e : entries)
    if (fnmatch(part.c_str(), e.filename().c_str(), FNM_PERIOD) == 0) glob_walk(e, parts, i + 1, out);
}

// The files a data_files pattern names, sorted and each once; relative patterns start at `base`.
std::vector<std::string> glob_files(const fs::path& base, const std::string& pattern) {
  const fs::path full = (fs::path(pattern).is_absolute() ? fs::path(pattern) : base / pattern).lexically_normal();
  fs::path root = full.root_path();
  std::vector<std::string> parts;
  for (const fs::path& component : full.relative_path()) parts.push_back(component.string());
  size_t fixed = 0;  // the leading folders without a wildcard: where the walk starts
  while (fixed + 1 < parts.size() && !has_wildcard(parts[fixed])) root /= parts[fixed++];
  std::vector<std::string> out;
  glob_walk(root.empty() ? fs::path(".") : root, parts, fixed, out);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

std::vector<SplitSlice> parse_split(const std::string& expression) {
  std::vector<SplitSlice> out;
  std::string rest = expression;
  size_t start = 0;
  while (true) {
    size_t plus = rest.find('+', start);
    std::string sub = trim(rest.substr(start, plus == std::string::npos ? std::string::npos : plus - start));
    if (sub.empty()) throw Error("dataset.split", "cannot parse '" + expression + "': empty part");
    out.push_back(parse_one(sub, expression));
    if (plus == std::string::npos) break;
    start = plus + 1;
  }
  return out;
}

std::pair<int64_t, int64_t> resolve_slice(const SplitSlice& slice, int64_t n) {
  auto pct = [&](int64_t boundary) -> int64_t {
    if (slice.pct1_dropremainder) {
      if (n < 100)
        throw Error("dataset.split", "pct1_dropremainder rounding needs a split of at least 100 rows, '" + slice.split +
                                         "' has " + std::to_string(n));
      return boundary * (int64_t)std::trunc((double)n / 100.0);
    }
    return (int64_t)std::nearbyint((double)(boundary * n) / 100.0);  // Python round(): halves to even
  };
  int64_t from = 0, to = n;
  if (slice.percent) {
    if (slice.from) from = pct(*slice.from);
    if (slice.to) to = pct(*slice.to);
  } else {
    if (slice.from) from = *slice.from;
    if (slice.to) to = *slice.to;
  }
  if (from < 0) from = std::max<int64_t>(n + from, 0);
  if (to < 0) to = std::max<int64_t>(n + to, 0);
  from = std::min(from, n);
  to = std::min(to, n);
  return {from, std::max(from, to)};
}

DataFiles resolve_data_files(const std::string& source, const std::string& data_dir,
                             const std::vector<std::string>& data_files) {
  DataFiles out;
  std::optional<DataFormat> format;
  fs::path base;
  static const char* kFormats[] = {"json", "jsonl", "csv", "parquet", "arrow", "text", "txt"};
  bool source_is_format = std::find(std::begin(kFormats), std::end(kFormats), source) != std::end(kFormats);
  if (source_is_format) {
    format = parse_data_format(source);
    base = data_dir.empty() ? fs::path(".") : fs::path(data_dir);
  } else if (!source.empty() && fs::is_regular_file(source)) {
    DataFormat f;
    if (!data_format_from_path(source, &f))
      throw Error("dataset.source", "cannot tell the format of '" + source + "' from its extension; set source to json, csv, parquet, arrow or text and data_files to the file");
    out.format = f;
    out.splits["train"] = {source};
    out.description = source;
    return out;
  } else if (!source.empty() && fs::is_directory(source)) {
    base = data_dir.empty() ? fs::path(source) : fs::path(source) / data_dir;
  } else {
    throw Error("dataset.source", "'" + source + "' is neither a data format (json, csv, parquet, arrow, text) nor a local file or folder; ktune reads local files (fetch Hub datasets with the dataset initializer or `ktune download`)");
  }
  if (!data_dir.empty() && !fs::is_directory(base))
    throw Error("dataset.data_dir", "'" + base.string() + "' is not a folder");

  std::vector<std::string> files;
  bool explicit_files = !data_files.empty();
  if (explicit_files) {
    for (const std::string& spec : data_files) {
      fs::path p = fs::path(spec).is_absolute() ? fs::path(spec) : base / spec;
      if (has_wildcard(spec)) {
        const std::vector<std::string> matched = glob_files(base, spec);
        if (matched.empty()) throw Error("dataset.data_files", "no file matches '" + p.lexically_normal().string() + "'");
        files.insert(files.end(), matched.begin(), matched.end());
      } else {
        if (!fs::is_regular_file(p)) throw Error("dataset.data_files", "'" + p.string() + "' is not a file");
        files.push_back(p.string());
      }
    }
  } else {
    if (!fs::is_directory(base)) throw Error("dataset.data_dir", "'" + base.string() + "' is not a folder");
    files = list_files(base);
  }

  // The format: given, or the most common known extension (HF infers it the same way).
  if (!format) {
    std::map<DataFormat, int> votes;
    for (const std::string& f : files) {
      DataFormat d;
      if (data_format_from_path(f, &d)) ++votes[d];
    }
    if (votes.empty())
      throw Error("dataset.source", "no json, jsonl, csv, parquet, arrow or txt files in '" + base.string() + "'");
    format = std::max_element(votes.begin(), votes.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  }
  out.format = *format;
  // Keep the files of that format (a listed folder also holds READMEs and the like).
  if (!explicit_files) {
    std::vector<std::string> kept;
    for (const std::string& f : files) {
      DataFormat d;
      if (data_format_from_path(f, &d) && d == *format) kept.push_back(f);
    }
    files = std::move(kept);
  }
  std::string named;  // the files data_files gave, for errors about what they hold (the first three)
  for (size_t i = 0; i < files.size() && i < 3; ++i) named += (i ? ", " : "") + files[i];
  if (files.size() > 3) named += " and " + std::to_string(files.size() - 3) + " more";
  out.description = data_format_name(*format) + " files " +
                    (explicit_files ? "given by data_files (" + named + ")" : "in " + base.string());
  if (files.empty())
    throw Error(explicit_files ? "dataset.data_files" : "dataset.data_dir",
                "no " + data_format_name(*format) + " files in '" + base.string() + "'");

  if (explicit_files) {
    out.splits["train"] = files;
    return out;
  }
  bool any_named = false;
  for (const std::string& f : files)
    if (!split_of_path(fs::relative(f, base).string()).empty()) any_named = true;
  for (const std::string& f : files) {
    std::string split = any_named ? split_of_path(fs::relative(f, base).string()) : "train";
    if (!split.empty()) out.splits[split].push_back(f);
  }
  for (auto& [name, list] : out.splits) std::sort(list.begin(), list.end());
  return out;
}

void read_split_rows(const DataFiles& files, const std::string& split_expression,
                     const std::function<void(const DataRow& row, const RowPlace& place)>& on_row) {
  for (const SplitSlice& slice : parse_split(split_expression)) {
    auto it = files.splits.find(slice.split);
    if (it == files.splits.end()) {
      std::string names;
      for (const auto& [name, list] : files.splits) names += (names.empty() ? "" : ", ") + name;
      throw Error("dataset.split", "split '" + slice.split + "' not found in the " + files.description +
                                       "; splits there: " + (names.empty() ? "none" : names));
    }
    const std::vector<std::string>& list = it->second;
    bool needs_count = slice.percent || (slice.from && *slice.from < 0) || (slice.to && *slice.to < 0);
    int64_t total = -1;
    if (needs_count) {
      total = 0;
      for (const std::string& f : list) total += count_rows(f, files.format);
    }
    int64_t begin = 0, end = INT64_MAX;
    if (total >= 0) {
      std::tie(begin, end) = resolve_slice(slice, total);
    } else {
      if (slice.from) begin = *slice.from;
      if (slice.to) end = *slice.to;
    }
    int64_t index = 0, emitted = 0;
    for (const std::string& f : list) {
      if (index >= end) break;
      read_rows(f, files.format, [&](const DataRow& row, const RowPlace& place) {
        if (index >= begin && index < end) {
          on_row(row, place);
          ++emitted;
        }
        ++index;
      });
    }
    if (emitted == 0) {
      std::string sub = slice.split;
      throw Error("dataset.split", "'" + split_expression + "' selects no rows: split '" + sub + "' has " +
                                       std::to_string(total >= 0 ? total : index) + " rows in the " + files.description);
    }
  }
}

}  // namespace ktune
