// JSON lines ↔ token ids for `ktune tokenize` (see tokenize_lines.h).
#include "text/tokenize_lines.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <istream>
#include <ostream>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace ktune {

namespace {

std::string convert_line(const Tokenizer& tok, const std::string& line, const TokenizeLinesOptions& opt,
                         const std::string& where) {
  if (line.find_first_not_of(" \t\r") == std::string::npos) return std::string();
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(where, std::string("not valid JSON: ") + e.what());
  }
  if (!opt.decode) {
    if (!value.is_string()) throw Error(where, "expected a JSON string (the text to encode)");
    std::vector<int32_t> ids = tok.encode(value.get_ref<const std::string&>(), opt.add_bos, opt.add_eos);
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(ids[i]);
    }
    return out + "]";
  }
  if (!value.is_array()) throw Error(where, "expected a JSON array of token ids");
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (const auto& v : value) {
    if (!v.is_number_integer()) throw Error(where, "expected a JSON array of integer token ids");
    // As the JSON says it (an unsigned past 2^63 too), never wrapped to 32 bits into another id.
    const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(INT32_MAX)
                                                 : v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX;
    if (!in_range) throw Error(where, "cannot decode id " + v.dump() + ": outside the vocabulary [0, " +
                                          std::to_string(tok.vocab_size()) + ")");
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  return nlohmann::json(tok.decode(ids, opt.skip_special)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

size_t tokenize_json_lines(const Tokenizer& tok, std::istream& in, std::ostream& out,
                           const TokenizeLinesOptions& options, const std::string& input_name) {
  constexpr size_t kBatch = 2048;
  std::vector<std::string> lines, results;
  size_t line_no = 0;
  while (true) {
    lines.clear();
    std::string line;
    while (lines.size() < kBatch && std::getline(in, line)) lines.push_back(std::move(line));
    if (lines.empty()) break;
    results.assign(lines.size(), std::string());
    std::vector<std::string> errors(lines.size());
    parallel_for(int64_t(lines.size()), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        try {
          results[size_t(i)] = convert_line(tok, lines[size_t(i)], options,
                                            input_name + ":" + std::to_string(line_no + size_t(i) + 1));
        } catch (const std::exception& ex) {
          errors[size_t(i)] = ex.what();
        }
      }
    }, 64);
    for (size_t i = 0; i < lines.size(); ++i) {
      if (!errors[i].empty()) throw Error(errors[i]);
      out << results[i] << '\n';
    }
    line_no += lines.size();
  }
  out.flush();
  return line_no;
}

}  // namespace ktune
