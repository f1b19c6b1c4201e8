// PCRE2 wrapper: compiled once with UTF | UCP and JIT-compiled; match data, match context and a
// JIT stack live per thread so that const matching is thread-safe and allocation-free per call.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/pcre2_regex.h"

#include <pcre2.h>

#include <memory>

#include "core/error.h"

namespace ktune::text {

namespace {

struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    data = pcre2_match_data_create(4, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (stack) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    if (stack) pcre2_jit_stack_free(stack);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

Pcre2Regex::Pcre2Regex(std::string_view pattern, const std::string& where) : pattern_(pattern), where_(where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &error, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw Error(where, "cannot compile regex /" + std::string(pattern) + "/ at offset " + std::to_string(offset) + ": " +
                           reinterpret_cast<char*>(message));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Pcre2Regex::~Pcre2Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Pcre2Regex::next_match(std::string_view s, size_t start, size_t* begin, size_t* end) const {
  ThreadMatchState& st = thread_state();
  auto* code = static_cast<pcre2_code*>(code_);
  int rc;
  if (jit_) {
    rc = pcre2_jit_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, 0, st.data, st.context);
  } else {
    rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, PCRE2_NO_UTF_CHECK, st.data,
                     st.context);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof message);
    throw Error(where_, "regex match failed: " + std::string(reinterpret_cast<char*>(message)));
  }
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
  *begin = ov[0];
  *end = ov[1];
  return true;
}

}  // namespace ktune::text
