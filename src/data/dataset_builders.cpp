// The dataset builders (see dataset_builders.h). The row → messages rules copy torchtune 0.6.1's
// InputOutputToMessages, AlpacaToMessages, ShareGPTToMessages and OpenAIToMessages
// (torchtune/data/_messages.py); tests/data compares whole datasets with torchtune's output.
// Rows are tokenized in parallel, a chunk at a time, and appended in file order.
#include "data/dataset_builders.h"

#include <exception>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "data/data_source.h"

namespace ktune {

namespace {

std::string column_list(const DataRow& row) {
  std::string out;
  for (const auto& [key, value] : row.items()) out += (out.empty() ? "" : ", ") + key;
  return out.empty() ? "(none)" : out;
}

const DataRow& column(const DataRow& row, const std::string& name, const RowPlace& place,
                             const std::string& option) {
  auto it = row.find(name);
  if (it == row.end())
    throw Error(place.where(), "column '" + name + "'" + (option.empty() ? "" : " (" + option + ")") +
                                   " not found; the columns are: " + column_list(row));
  return *it;
}

std::string as_text(const DataRow& value, const RowPlace& place, const std::string& name) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number() || value.is_boolean()) return value.dump();
  if (value.is_null()) throw Error(place.where(), "column '" + name + "' is empty (null)");
  throw Error(place.where(), "column '" + name + "' holds " + std::string(value.type_name()) + ", expected text");
}

std::string text_column(const DataRow& row, const std::string& name, const RowPlace& place,
                        const std::string& option = "") {
  return as_text(column(row, name, place, option), place, name);
}

std::string mapped(const std::map<std::string, std::string>& column_map, const std::string& key) {
  auto it = column_map.find(key);
  return it == column_map.end() ? key : it->second;
}

const DataRow& conversation(const DataRow& row, const std::string& name, const RowPlace& place) {
  const DataRow& value = column(row, name, place, "conversation_column");
  if (!value.is_array())
    throw Error(place.where(), "column '" + name + "' holds " + std::string(value.type_name()) + ", expected a list of messages");
  return value;
}

// The messages of a conversation column: the optional new system prompt, then each entry read by
// `read_message` (which names the entry's place in its errors). A system message is dropped when a
// new system prompt replaces it; every message but the assistant's is masked unless train_on_input.
template <typename ReadMessage>
std::vector<Message> conversation_to_messages(const DatasetOptions& o, const DataRow& row, const RowPlace& place,
                                              const ReadMessage& read_message) {
  const bool train_on_input = o.train_on_input.value_or(false);
  std::vector<Message> messages;
  if (o.new_system_prompt) messages.push_back(Message::text("system", *o.new_system_prompt, true));
  const DataRow& list = conversation(row, o.conversation_column, place);
  for (size_t k = 0; k < list.size(); ++k) {
    Message message = read_message(list[k], place.where() + ": message " + std::to_string(k));
    if (message.role == "system" && o.new_system_prompt) continue;
    message.masked = message.role != "assistant" && !train_on_input;
    messages.push_back(std::move(message));
  }
  return messages;
}

// {"from": "human" | "gpt" | "system", "value": text}
std::vector<Message> sharegpt_to_messages(const DatasetOptions& o, const DataRow& row, const RowPlace& place) {
  return conversation_to_messages(o, row, place, [&](const DataRow& m, const std::string& at) {
    if (!m.is_object() || !m.contains("from") || !m.contains("value"))
      throw Error(at, "a sharegpt message needs 'from' and 'value' keys, got " + m.dump().substr(0, 200));
    std::string from = as_text(m["from"], place, o.conversation_column + ".from");
    std::string role;
    if (from == "system") role = "system";
    else if (from == "human") role = "user";
    else if (from == "gpt") role = "assistant";
    else throw Error(at, "unknown sharegpt role '" + from + "'; expected system, human or gpt");
    return Message::text(role, as_text(m["value"], place, o.conversation_column + ".value"), false);
  });
}

// {"role": "system" | "user" | "assistant" | "tool" | "ipython", "content": text or [{"type": "text", ...}],
//  and for tool calling "tool_calls" (an assistant's, content then may be null or absent), "name",
//  "tool_call_id", ...}. "tool" (the name transformers' templates know) is torchtune's "ipython". The
// message itself is kept (Message::source): a model's own chat template gets it as it is, tool_calls
// and all, as transformers' apply_chat_template would.
std::vector<Message> openai_to_messages(const DatasetOptions& o, const DataRow& row, const RowPlace& place) {
  return conversation_to_messages(o, row, place, [&](const DataRow& m, const std::string& at) {
    if (!m.is_object() || !m.contains("role"))
      throw Error(at, "an openai message needs 'role' and 'content' keys, got " + m.dump().substr(0, 200));
    Message msg;
    msg.source = m;
    const bool calls = msg.has_tool_calls();
    if (!m.contains("content") && !calls)
      throw Error(at, "an openai message needs 'role' and 'content' keys, got " + m.dump().substr(0, 200));
    std::string role = as_text(m["role"], place, o.conversation_column + ".role");
    if (role != "system" && role != "user" && role != "assistant" && role != "ipython" && role != "tool")
      throw Error(at, "unknown openai role '" + role + "'; expected system, user, assistant, tool or ipython");
    if (calls && role != "assistant") throw Error(at, "tool_calls in a " + role + " message; only an assistant calls tools");
    msg.role = role == "tool" ? "ipython" : role;
    const DataRow content = m.value("content", DataRow());
    if (content.is_null() && calls) return msg;  // a call and no text
    if (content.is_array()) {
      for (const DataRow& piece : content) {
        std::string type = piece.value("type", "");
        if (type == "text") msg.content.push_back(as_text(piece.value("text", DataRow()), place, "content.text"));
        else if (type == "image_url") throw Error(at, "images (image_url) are not supported by ktune's text datasets");
        else throw Error(at, "unknown content type '" + type + "'; expected text");
      }
    } else {
      msg.content.push_back(as_text(content, place, o.conversation_column + ".content"));
    }
    return msg;
  });
}

// A conversation's tools (TRL's convention: a row's "tools" column, handed to the chat template as
// apply_chat_template(tools=...)): a list of tool schemas, or JSON text of one (Parquet datasets
// often store them as a string); null when the row has none.
DataRow row_tools(const DataRow& row, const RowPlace& place) {
  auto it = row.find("tools");
  if (it == row.end() || it->is_null()) return nullptr;
  DataRow tools = *it;
  if (tools.is_string()) {
    const std::string text = tools.get<std::string>();
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) return nullptr;
    try {
      tools = DataRow::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(place.where(), "column 'tools' holds text that is not JSON: " + std::string(e.what()).substr(0, 200));
    }
  }
  if (!tools.is_array())
    throw Error(place.where(), "column 'tools' holds " + std::string(tools.type_name()) + ", expected a list of tool schemas");
  return tools;
}

}  // namespace

std::string dataset_builder_name(const std::string& component) {
  std::string name = component;
  const std::string prefix = "torchtune.datasets.";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  if (name == "instruct_dataset" || name == "alpaca_dataset" || name == "alpaca_cleaned_dataset" ||
      name == "chat_dataset" || name == "text_completion_dataset")
    return name;
  throw Error("dataset._component_", "unknown dataset builder '" + component +
                                         "'; expected instruct_dataset, alpaca_dataset, alpaca_cleaned_dataset, chat_dataset or text_completion_dataset");
}

bool split_across_pack(const DatasetOptions& options) {
  if (options.split_across_pack) return *options.split_across_pack;
  return dataset_builder_name(options.component) == "text_completion_dataset";
}

std::vector<Message> row_to_messages(const DatasetOptions& o, const DataRow& row, const RowPlace& place) {
  const std::string name = dataset_builder_name(o.component);
  if (name == "instruct_dataset") {
    return input_output_to_messages(text_column(row, mapped(o.column_map, "input"), place, "column_map.input"),
                                    text_column(row, mapped(o.column_map, "output"), place, "column_map.output"),
                                    o.train_on_input.value_or(false), o.new_system_prompt);
  }
  if (name == "alpaca_dataset" || name == "alpaca_cleaned_dataset") {
    // AlpacaToMessages: the "### Input:" block only when the input column exists and is non-empty.
    std::string input;
    auto it = row.find(mapped(o.column_map, "input"));
    if (it != row.end() && !it->is_null()) input = as_text(*it, place, mapped(o.column_map, "input"));
    return alpaca_to_messages(text_column(row, mapped(o.column_map, "instruction"), place, "column_map.instruction"),
                              input, text_column(row, mapped(o.column_map, "output"), place, "column_map.output"),
                              o.train_on_input.value_or(true));
  }
  if (name == "chat_dataset") {
    if (o.conversation_style == "sharegpt") return sharegpt_to_messages(o, row, place);
    if (o.conversation_style == "openai") return openai_to_messages(o, row, place);
    throw Error("dataset.conversation_style", "unsupported conversation style '" + o.conversation_style +
                                                  "'; expected sharegpt or openai");
  }
  throw Error("dataset._component_", name + " rows are not conversations");
}

TokenizedDataset build_dataset(const DatasetOptions& o, const ChatFormat& format) {
  const std::string name = dataset_builder_name(o.component);
  // Option checks first, before any file is read.
  if (name == "instruct_dataset" && !o.column_map.empty())
    for (const char* key : {"input", "output"})
      if (!o.column_map.count(key)) {
        std::string keys;
        for (const auto& [k, v] : o.column_map) keys += (keys.empty() ? "" : ", ") + k;
        throw Error("dataset.column_map", std::string("expected a key '") + key + "' in column_map, found: " + keys);
      }
  if (name == "chat_dataset") {
    if (o.conversation_style != "sharegpt" && o.conversation_style != "openai")
      throw Error("dataset.conversation_style", "unsupported conversation style '" + o.conversation_style +
                                                    "'; expected sharegpt or openai");
    if (o.conversation_column.empty())
      throw Error("dataset.conversation_column", "chat_dataset needs conversation_column (the column holding the messages)");
  }
  if (o.new_system_prompt && format.kind() == ChatFormatKind::kMistral)
    throw Error("dataset.new_system_prompt", "the mistral chat format has no system prompt (torchtune's MistralChatTemplate)");
  parse_split(o.split);  // a bad split expression fails before reading

  DataFiles files = resolve_data_files(o.source, o.data_dir, o.data_files);
  const int64_t max_seq_len = format.max_seq_len();
  TokenizedDataset data;
  data.max_seq_len = max_seq_len;

  // One row → ids + mask (1 = not trained). Pure, so rows are tokenized in parallel a chunk at a
  // time (the tokenizers' const encode is thread-safe) and appended in file order.
  auto tokenize_row = [&](const DataRow& row, const RowPlace& place) -> TokenizedMessages {
    if (name == "text_completion_dataset") {
      TokenizedMessages t;
      t.tokens = format.encode_text(text_column(row, o.column, place, "column"), true, o.add_eos);
      if (max_seq_len > 0 && (int64_t)t.tokens.size() > max_seq_len - 1) {
        t.tokens.resize((size_t)std::max<int64_t>(max_seq_len - 1, 0));  // truncate(tokens, max_seq_len - 1)
        t.truncated = true;
      }
      t.mask.assign(t.tokens.size(), 0);  // every token is a target
      return t;
    }
    std::vector<Message> messages = row_to_messages(o, row, place);
    validate_messages(messages, place.where());
    const DataRow tools = name == "chat_dataset" ? row_tools(row, place) : DataRow();
    try {
      return format.tokenize(messages, true, tools);
    } catch (const Error& e) {  // the format refuses this row (a template's raise_exception, a role it lacks)
      throw Error(place.where(), std::string(format.kind() == ChatFormatKind::kTemplate
                                                 ? "the chat template failed on this conversation: "
                                                 : "the " + chat_format_name(format.kind()) + " chat format refused this conversation: ") +
                                     e.what());
    }
  };

  constexpr size_t kChunk = 4096;
  std::vector<std::pair<DataRow, RowPlace>> pending;
  std::vector<TokenizedMessages> results;
  std::vector<std::exception_ptr> errors;
  std::vector<uint8_t> trained;
  auto flush = [&]() {
    const int64_t n = (int64_t)pending.size();
    results.assign((size_t)n, TokenizedMessages{});
    errors.assign((size_t)n, nullptr);
    parallel_for(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        try {
          results[(size_t)i] = tokenize_row(pending[(size_t)i].first, pending[(size_t)i].second);
        } catch (...) {
          errors[(size_t)i] = std::current_exception();
        }
      }
    }, 64);
    for (int64_t i = 0; i < n; ++i) {  // in order: the first bad row is the one reported
      if (errors[(size_t)i]) std::rethrow_exception(errors[(size_t)i]);
      const TokenizedMessages& t = results[(size_t)i];
      if (t.tokens.empty() && data.num_empty++ == 0) data.first_empty = pending[(size_t)i].second.where();
      if (t.truncated) ++data.num_truncated;
      trained.resize(t.mask.size());
      for (size_t k = 0; k < t.mask.size(); ++k) trained[k] = t.mask[k] ? 0 : 1;
      data.add(t.tokens, trained);
    }
    pending.clear();
  };
  read_split_rows(files, o.split, [&](const DataRow& row, const RowPlace& place) {
    ++data.num_rows_read;
    pending.emplace_back(row, place);
    if (pending.size() == kChunk) flush();
  });
  flush();
  data.shrink_to_fit();
  if (data.num_truncated > 0)
    log_warn(std::to_string(data.num_truncated) + " of " + std::to_string(data.size()) +
             " samples were longer than max_seq_len=" + std::to_string(max_seq_len) + " and were truncated");
  return data;
}

}  // namespace ktune
