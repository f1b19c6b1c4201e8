// The BPE pipeline (see bpe_tokenizer.h). Pre-tokenisation recurses step by step over views of the
// segment, so the common path (Split + ByteLevel) splits and encodes without copying text; only
// steps that rewrite text (Metaspace, ByteLevel's prefix space) own a temporary string.
#include "text/bpe_tokenizer.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace ktune::text {

namespace {

std::string replace_literal(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  if (from.empty()) return std::string(s);
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.data() + pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.data() + pos, s.size() - pos);
  return out;
}

std::string replace_regex(std::string_view s, const Pcre2Regex& re, std::string_view to) {
  std::string out;
  size_t pos = 0;
  re.for_each_match(s, [&](size_t b, size_t e) {
    out.append(s.data() + pos, b - pos);
    out.append(to);
    pos = e;
  });
  out.append(s.data() + pos, s.size() - pos);
  return out;
}

struct Part {
  size_t begin, end;
  bool is_match;
};

// HF's find_matches: the string covered by alternating non-matches and matches.
void find_parts(std::string_view s, const PreTokenizerStep& st, std::vector<Part>& parts) {
  size_t prev = 0;
  auto on_match = [&](size_t b, size_t e) {
    if (prev != b) parts.push_back({prev, b, false});
    parts.push_back({b, e, true});
    prev = e;
  };
  if (st.regex) {
    st.regex->for_each_match(s, on_match);
  } else if (!st.literal.empty()) {
    size_t pos = 0;
    while (true) {
      size_t hit = s.find(st.literal, pos);
      if (hit == std::string_view::npos) break;
      on_match(hit, hit + st.literal.size());
      pos = hit + st.literal.size();
    }
  }
  if (prev != s.size()) parts.push_back({prev, s.size(), false});
  if (st.invert)
    for (Part& p : parts) p.is_match = !p.is_match;
}

// HF's SplitDelimiterBehavior applied to parts; the kept pieces, in order.
void apply_behavior(std::vector<Part>& parts, SplitBehavior behavior, std::vector<Part>& out) {
  switch (behavior) {
    case SplitBehavior::kIsolated:
      out = parts;
      break;
    case SplitBehavior::kRemoved:
      for (const Part& p : parts)
        if (!p.is_match) out.push_back(p);
      break;
    case SplitBehavior::kContiguous: {
      bool previous = false;
      for (const Part& p : parts) {
        if (p.is_match == previous && !out.empty()) out.back().end = p.end;
        else out.push_back(p);
        previous = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous = false;
      for (const Part& p : parts) {
        if (p.is_match && !previous && !out.empty()) out.back().end = p.end;
        else out.push_back(p);
        previous = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous = false;
      for (size_t k = parts.size(); k-- > 0;) {
        const Part& p = parts[k];
        if (p.is_match && !previous && !out.empty()) out.back().begin = p.begin;
        else out.push_back(p);
        previous = p.is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
}

}  // namespace

void BpeTokenizer::finalize() {
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab) max_id = std::max(max_id, id);
  for (const AddedToken& t : added_tokens) max_id = std::max(max_id, t.id);
  vocab_size_ = max_id + 1;
  id_to_token_.assign(size_t(vocab_size_), std::string());
  special_.assign(size_t(vocab_size_), 0);
  added_.assign(size_t(vocab_size_), 0);
  for (const auto& [token, id] : vocab)
    if (id >= 0) id_to_token_[size_t(id)] = token;
  for (const AddedToken& t : added_tokens) {
    id_to_token_[size_t(t.id)] = t.content;
    special_[size_t(t.id)] = t.special;
    added_[size_t(t.id)] = 1;
    added_by_content_[t.content] = t.id;
  }
  byte_ids_.fill(-1);
  byte_fallback_ids_.fill(-1);
  raw_vocab_.clear();
  char_vocab_.clear();
  if (byte_level) {
    const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
    std::string bytes;
    raw_vocab_.reserve(vocab.size());
    for (const auto& [token, id] : vocab)
      if (alphabet.token_to_bytes(token, &bytes)) raw_vocab_.emplace(bytes, id);
    for (int b = 0; b < 256; ++b) {
      auto it = vocab.find(alphabet.byte_to_utf8(uint8_t(b)));
      if (it != vocab.end()) byte_ids_[size_t(b)] = it->second;
    }
  } else {
    char_vocab_.reserve(vocab.size());
    for (const auto& [token, id] : vocab) char_vocab_.emplace(token, id);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      auto it = vocab.find(name);
      if (it != vocab.end()) byte_fallback_ids_[size_t(b)] = it->second;
    }
  }
  raw_matcher_ = AddedTokenMatcher();
  normalized_matcher_ = AddedTokenMatcher();
  raw_ordinary_matcher_ = AddedTokenMatcher();
  normalized_ordinary_matcher_ = AddedTokenMatcher();
  for (const AddedToken& t : added_tokens) {
    std::string pattern = t.normalized ? normalize(t.content) : t.content;
    (t.normalized ? normalized_matcher_ : raw_matcher_).add(pattern, t);
    if (!t.special) (t.normalized ? normalized_ordinary_matcher_ : raw_ordinary_matcher_).add(pattern, t);
  }
}

std::string BpeTokenizer::normalize(std::string_view input) const {
  std::string s(input);
  for (const NormalizerStep& st : normalizers) {
    switch (st.kind) {
      case NormalizerStep::Kind::kNfc: s = unicode_normalize(s, NormalForm::kNfc); break;
      case NormalizerStep::Kind::kNfd: s = unicode_normalize(s, NormalForm::kNfd); break;
      case NormalizerStep::Kind::kNfkc: s = unicode_normalize(s, NormalForm::kNfkc); break;
      case NormalizerStep::Kind::kNfkd: s = unicode_normalize(s, NormalForm::kNfkd); break;
      case NormalizerStep::Kind::kLowercase: s = unicode_lowercase(s); break;
      case NormalizerStep::Kind::kReplace:
        s = st.regex ? replace_regex(s, *st.regex, st.content) : replace_literal(s, st.pattern, st.content);
        break;
      case NormalizerStep::Kind::kPrepend:
        if (!s.empty()) s.insert(0, st.content);
        break;
      case NormalizerStep::Kind::kStrip: {
        size_t b = 0, e = s.size();
        if (st.strip_left)
          while (b < e) {
            char32_t cp;
            int len = utf8_decode(s, b, &cp);
            if (!is_unicode_whitespace(cp)) break;
            b += len;
          }
        if (st.strip_right)
          while (e > b) {
            size_t p = e - 1;
            while (p > b && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
            char32_t cp;
            utf8_decode(s, p, &cp);
            if (!is_unicode_whitespace(cp)) break;
            e = p;
          }
        s = s.substr(b, e - b);
        break;
      }
    }
  }
  return s;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  return encode_with(text, add_bos, add_eos, raw_matcher_, normalized_matcher_);
}

std::vector<int32_t> BpeTokenizer::encode_ordinary(std::string_view text) const {
  return encode_with(text, false, false, raw_ordinary_matcher_, normalized_ordinary_matcher_);
}

std::vector<int32_t> BpeTokenizer::encode_with(std::string_view text, bool add_bos, bool add_eos,
                                               const AddedTokenMatcher& raw_matcher,
                                               const AddedTokenMatcher& normalized_matcher) const {
  require_valid_utf8(text, source + ": text to encode");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_bos && bos) ids.push_back(*bos);
  std::vector<TextSegment> segments;
  if (raw_matcher.empty()) {
    if (!text.empty()) segments.push_back(TextSegment{0, text.size(), -1});
  } else {
    raw_matcher.split(text, segments);
  }
  std::vector<TextSegment> inner;
  for (const TextSegment& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
    std::string normalized;
    if (!normalizers.empty()) {
      normalized = normalize(piece);
      piece = normalized;
    }
    if (normalized_matcher.empty()) {
      encode_segment(piece, seg.begin == 0, ids);
      continue;
    }
    inner.clear();
    normalized_matcher.split(piece, inner);
    for (const TextSegment& s : inner) {
      if (s.id >= 0) ids.push_back(s.id);
      else encode_segment(piece.substr(s.begin, s.end - s.begin), seg.begin == 0 && s.begin == 0, ids);
    }
  }
  if (add_eos && eos) ids.push_back(*eos);
  return ids;
}

void BpeTokenizer::encode_segment(std::string_view segment, bool at_start, std::vector<int32_t>& ids) const {
  pre_tokenize(0, segment, at_start, ids);
}

void BpeTokenizer::pre_tokenize(size_t step, std::string_view piece, bool at_start, std::vector<int32_t>& ids) const {
  if (piece.empty()) return;
  if (step == pre_tokenizers.size()) {
    encode_piece(piece, ids);
    return;
  }
  const PreTokenizerStep& st = pre_tokenizers[step];
  switch (st.kind) {
    case PreTokenizerStep::Kind::kByteLevel: {
      if (st.add_prefix_space && piece[0] != ' ') {
        std::string spaced = " " + std::string(piece);
        pre_tokenize(step + 1, spaced, at_start, ids);
      } else {
        pre_tokenize(step + 1, piece, at_start, ids);
      }
      return;
    }
    case PreTokenizerStep::Kind::kMetaspace: {
      std::string s = replace_literal(piece, " ", st.replacement);
      bool starts = s.compare(0, st.replacement.size(), st.replacement) == 0;
      if (!starts && (st.prepend == PreTokenizerStep::Prepend::kAlways ||
                      (st.prepend == PreTokenizerStep::Prepend::kFirst && at_start)))
        s.insert(0, st.replacement);
      if (!st.split) {
        pre_tokenize(step + 1, s, at_start, ids);
        return;
      }
      PreTokenizerStep literal;
      literal.kind = PreTokenizerStep::Kind::kSplit;
      literal.literal = st.replacement;
      std::vector<Part> parts, kept;
      find_parts(s, literal, parts);
      apply_behavior(parts, SplitBehavior::kMergedWithNext, kept);
      for (const Part& p : kept) pre_tokenize(step + 1, std::string_view(s).substr(p.begin, p.end - p.begin), at_start && p.begin == 0, ids);
      return;
    }
    case PreTokenizerStep::Kind::kSplit: {
      if (st.behavior == SplitBehavior::kIsolated && !st.invert && st.regex) {
        size_t prev = 0;
        st.regex->for_each_match(piece, [&](size_t b, size_t e) {
          if (prev != b) pre_tokenize(step + 1, piece.substr(prev, b - prev), at_start && prev == 0, ids);
          if (e > b) pre_tokenize(step + 1, piece.substr(b, e - b), at_start && b == 0, ids);
          prev = e;
        });
        if (prev != piece.size()) pre_tokenize(step + 1, piece.substr(prev), at_start && prev == 0, ids);
        return;
      }
      std::vector<Part> parts, kept;
      find_parts(piece, st, parts);
      apply_behavior(parts, st.behavior, kept);
      for (const Part& p : kept)
        if (p.end > p.begin) pre_tokenize(step + 1, piece.substr(p.begin, p.end - p.begin), at_start && p.begin == 0, ids);
      return;
    }
  }
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (!byte_level) {
    encode_piece_chars(piece, ids);
    return;
  }
  if (ignore_merges) {
    auto it = raw_vocab_.find(piece);
    if (it != raw_vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  if (cache_.lookup(piece, ids)) return;
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  int32_t pending_unk = -1;  // an unknown symbol not yet pushed (fuse_unk joins runs)
  for (unsigned char b : piece) {
    int32_t id = byte_ids_[b];
    if (id >= 0) {
      if (pending_unk >= 0) symbols.push_back(pending_unk), pending_unk = -1;
      symbols.push_back(id);
    } else if (unk_id) {
      if (pending_unk >= 0 && !fuse_unk) symbols.push_back(pending_unk);
      pending_unk = *unk_id;
    }
  }
  if (pending_unk >= 0) symbols.push_back(pending_unk);
  merges.merge(symbols);
  cache_.store(piece, symbols.data(), symbols.size());
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

void BpeTokenizer::encode_piece_chars(std::string_view piece, std::vector<int32_t>& ids) const {
  if (ignore_merges) {
    auto it = char_vocab_.find(piece);
    if (it != char_vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  if (cache_.lookup(piece, ids)) return;
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  int32_t pending_unk = -1;  // an unknown symbol not yet pushed (fuse_unk joins runs)
  const bool affixes = !continuing_subword_prefix.empty() || !end_of_word_suffix.empty();
  std::string scratch;
  for (size_t i = 0; i < piece.size();) {
    int len = utf8_length(static_cast<unsigned char>(piece[i]));
    std::string_view ch = piece.substr(i, size_t(len));
    bool last = i + size_t(len) >= piece.size();
    if (affixes) {
      scratch.clear();
      if (i > 0) scratch += continuing_subword_prefix;
      scratch += ch;
      if (last) scratch += end_of_word_suffix;
      ch = scratch;
    }
    i += size_t(len);
    auto it = char_vocab_.find(ch);
    if (it != char_vocab_.end()) {
      if (pending_unk >= 0) symbols.push_back(pending_unk), pending_unk = -1;
      symbols.push_back(it->second);
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_fallback_ids_[b] >= 0;
      if (all) {
        // As HF: the byte tokens go in without flushing a pending unknown.
        for (unsigned char b : ch) symbols.push_back(byte_fallback_ids_[b]);
        continue;
      }
    }
    if (unk_id) {
      if (pending_unk >= 0 && !fuse_unk) symbols.push_back(pending_unk);
      pending_unk = *unk_id;
    }
  }
  if (pending_unk >= 0) symbols.push_back(pending_unk);
  merges.merge(symbols);
  cache_.store(piece, symbols.data(), symbols.size());
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_)
      throw Error(source, "cannot decode id " + std::to_string(id) + ": outside the vocabulary [0, " +
                              std::to_string(vocab_size_) + ")");
    if (skip_special && special_[size_t(id)]) continue;
    if (id_to_token_[size_t(id)].empty()) continue;  // a hole in the id space: HF skips it too
    tokens.push_back(id_to_token_[size_t(id)]);
  }
  if (!has_decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  for (const DecoderStep& st : decoders) {
    switch (st.kind) {
      case DecoderStep::Kind::kByteLevel: {
        const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
        std::string bytes, piece;
        for (const std::string& t : tokens) {
          if (alphabet.token_to_bytes(t, &piece)) bytes += piece;
          else bytes += t;
        }
        tokens.assign(1, utf8_lossy(bytes));
        break;
      }
      case DecoderStep::Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string pending;
        auto flush = [&] {
          if (pending.empty()) return;
          if (find_invalid_utf8(pending) == std::string_view::npos) out.push_back(pending);
          else
            for (size_t k = 0; k < pending.size(); ++k) out.push_back("\xEF\xBF\xBD");
          pending.clear();
        };
        for (std::string& t : tokens) {
          unsigned value;
          char tail;
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit((unsigned char)t[3]) &&
              std::isxdigit((unsigned char)t[4]) && std::sscanf(t.c_str() + 3, "%2x%c", &value, &tail) == 2) {
            pending.push_back(char(value));
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case DecoderStep::Kind::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, all);
        break;
      }
      case DecoderStep::Kind::kStrip: {
        for (std::string& t : tokens) {
          std::u32string chars;
          for (size_t i = 0; i < t.size();) {
            char32_t cp;
            i += size_t(utf8_decode(t, i, &cp));
            chars.push_back(cp);
          }
          size_t start_cut = 0;
          for (size_t i = 0; i < std::min(st.strip_start, chars.size()); ++i) {
            if (chars[i] != st.strip_char) break;
            start_cut = i + 1;
          }
          size_t stop_cut = chars.size();
          for (size_t i = 0; i < st.strip_stop && i < chars.size(); ++i) {
            size_t index = chars.size() - i - 1;
            if (chars[index] != st.strip_char) break;
            stop_cut = index;
          }
          std::string out;
          for (size_t i = start_cut; i < stop_cut; ++i) utf8_append(out, chars[i]);
          t = out;
        }
        break;
      }
      case DecoderStep::Kind::kReplace:
        for (std::string& t : tokens)
          t = st.regex ? replace_regex(t, *st.regex, st.content) : replace_literal(t, st.pattern, st.content);
        break;
      case DecoderStep::Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          bool drop = i == 0 && st.metaspace_prepend;
          tokens[i] = replace_literal(tokens[i], st.replacement, drop ? "" : " ");
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  auto a = added_by_content_.find(std::string(token));
  if (a != added_by_content_.end()) return a->second;
  auto it = vocab.find(std::string(token));
  if (it != vocab.end()) return it->second;
  return std::nullopt;
}

std::string BpeTokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size_) throw Error(source, "id " + std::to_string(id) + " is outside the vocabulary");
  return id_to_token_[size_t(id)];
}

bool BpeTokenizer::is_special(int32_t id) const { return id >= 0 && id < vocab_size_ && special_[size_t(id)]; }

}  // namespace ktune::text
