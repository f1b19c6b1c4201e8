// torchtune's dataset builders, by name and parameter, producing a TokenizedDataset:
//   instruct_dataset(source, column_map{input, output}, train_on_input=false, new_system_prompt,
//                    split, packed, data_dir/data_files)
//   alpaca_dataset / alpaca_cleaned_dataset (column_map{instruction, input, output},
//                    train_on_input=true; the alpaca prompt)
//   chat_dataset(conversation_column, conversation_style sharegpt|openai, train_on_input=false,
//                new_system_prompt)
//   text_completion_dataset(column="text", add_eos=true)
// SFT rows go row → messages (torchtune's *ToMessages transforms) → validate_messages → the
// model's chat format (text/chat_format.h) → tokens and "trained" bytes (labels -100 where the
// mask says not to train). Text completion encodes with BOS (+EOS) and keeps max_seq_len - 1
// tokens, as torchtune's TextCompletionDataset does. Samples longer than max_seq_len are cut
// and counted (TokenizedDataset::num_truncated; a warning says how many).
//
// DatasetOptions is the `dataset:` section of a torchtune config with the same key names (the
// config layer fills it). Deliberately not here: the Hub, filter_fn, multimodal datasets,
// packing (the loader packs on the fly, see data_loader.h).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/row_reader.h"
#include "data/tokenized_dataset.h"
#include "text/chat_format.h"

namespace ktune {

struct DatasetOptions {
  // instruct_dataset | alpaca_dataset | alpaca_cleaned_dataset | chat_dataset |
  // text_completion_dataset, bare or as torchtune.datasets.<name>.
  std::string component = "instruct_dataset";
  std::string source;                       // json | csv | parquet | arrow | text | a local path
  std::string data_dir;
  std::vector<std::string> data_files;
  std::string split = "train";
  std::map<std::string, std::string> column_map;
  std::optional<bool> train_on_input;       // default false (alpaca: true)
  std::optional<std::string> new_system_prompt;
  bool packed = false;
  std::optional<bool> split_across_pack;    // default false (text completion: true)
  std::string conversation_column;          // chat_dataset
  std::string conversation_style;           // chat_dataset: sharegpt | openai
  std::string column = "text";              // text_completion_dataset
  bool add_eos = true;                      // text_completion_dataset
};

// The builder's name without a "torchtune.datasets." prefix; throws on an unknown one.
std::string dataset_builder_name(const std::string& component);
// Whether packs may split a sample across two packs for these options (torchtune's defaults).
bool split_across_pack(const DatasetOptions& options);

// Reads and tokenizes the rows. format carries the tokenizer and max_seq_len (0: no limit).
// Throws ktune::Error naming the file, row and column at fault, or the option key.
TokenizedDataset build_dataset(const DatasetOptions& options, const ChatFormat& format);

// Row → messages, for builders and for tests (the place names the row in errors).
std::vector<Message> row_to_messages(const DatasetOptions& options, const DataRow& row, const RowPlace& place);

}  // namespace ktune
