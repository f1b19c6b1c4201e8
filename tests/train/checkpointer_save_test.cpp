// What a save writes from the trainable values it is handed as a stream (StreamedTensors): a GPU
// run's rank 0 keeps no host values and streams the trained ones from the GPUs, in the order they
// are gathered, not the files'. The checkpoint must be the one a save of the host values writes,
// byte for byte, across the input's shards; a stream that leaves a tensor out fails the save naming
// it, and leaves nothing behind (an older checkpoint of its name as it was). What a killed save
// leaves is put right before a resume looks for the latest checkpoint.
#include <gtest/gtest.h>

#include <chrono>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/adapters/lora_adapter.h"
#include "train/checkpointer.h"

using namespace ktune;
namespace fs = std::filesystem;

namespace {

const fs::path kModel = fs::path(KTUNE_SOURCE_DIR) / "tests/train/peft_steps/untied_llama";

// Every file under dir (weights, index, recipe state, config), by path relative to it.
std::map<std::string, std::string> file_bytes(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    files[fs::relative(e.path(), dir).string()] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

// The names in dir (hidden ones too), sorted.
std::vector<std::string> entries_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The checkpoint in `got` holds the files of the one in `want` (more than the config and an index),
// byte for byte.
void expect_same_files(const std::string& want_dir, const std::string& got_dir) {
  const std::map<std::string, std::string> want = file_bytes(want_dir), got = file_bytes(got_dir);
  EXPECT_GT(want.size(), 4u);
  EXPECT_EQ(want.size(), got.size());
  for (const auto& [file, bytes] : want) {
    ASSERT_TRUE(got.count(file)) << file << " not written in " << got_dir;
    EXPECT_TRUE(got.at(file) == bytes) << file << " differs from " << want_dir << "'s";
  }
}

class CheckpointerSave : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::remove_all(root_);
    // The tiny model as a sharded checkpoint (four files or so, and the index), so that the streamed
    // values land in several model files.
    fs::create_directories(input_);
    fs::copy_file(kModel / "config.json", input_ / "config.json");
    io::SafetensorsFile whole = io::SafetensorsFile::open((kModel / "model.safetensors").string());
    std::vector<io::NamedTensor> tensors;
    for (const std::string& name : whole.names()) tensors.push_back({name, whole.to_f32(name)});
    const std::vector<std::string> written = io::write_safetensors_sharded(input_.string(), tensors, 100 << 10);
    ASSERT_GT(written.size(), 3u);  // shards and the index
  }
  void TearDown() override { fs::remove_all(root_); }

  train::SaveRequest request(const std::string& name, model::Decoder& decoder) const {
    train::SaveRequest r;
    r.name = name;
    r.decoder = &decoder;
    r.weights_dtype = DType::BF16;
    r.recipe_state = {{"global_step", 1}};
    return r;
  }

  // The input model in f32 with DoRA adapters (rank 2) on q_proj and v_proj, and a save request of
  // it with its trainable values (the adapters) on the host.
  struct WithDora {
    std::unique_ptr<model::Decoder> decoder;
    model::LoraOptions options;
    model::LoraTargets targets{{"q_proj", "v_proj"}, true, false};
    std::vector<std::shared_ptr<model::LoraAdapter>> adapters;
    std::vector<model::Parameter*> trainable, frozen;
  };
  WithDora with_dora(const train::HfCheckpointer& checkpointer) const {
    WithDora m;
    m.decoder = checkpointer.load_model(DType::F32);
    m.options.rank = 2;
    m.options.use_dora = true;
    m.adapters = model::attach_lora(*m.decoder, m.targets, m.options);
    for (model::Parameter* p : m.decoder->parameters()) (p->trainable ? m.trainable : m.frozen).push_back(p);
    return m;
  }
  train::SaveRequest lora_request(const std::string& name, const WithDora& m) const {
    train::SaveRequest r = request(name, *m.decoder);
    r.adapters = m.adapters;
    r.adapter = train::AdapterDescription{m.options, model::lora_target_modules(m.targets)};
    r.trainable = train::host_trainable_values(m.trainable);
    return r;
  }

  fs::path root_ = fs::temp_directory_path() / ("ktune-save-" + std::to_string(::getpid()));
  fs::path input_ = root_ / "input";
  fs::path output_ = root_ / "output";
};

TEST_F(CheckpointerSave, TrainableValuesStreamedInAnyOrderWriteTheHostValuesCheckpointByteForByte) {
  train::HfCheckpointer checkpointer(input_.string(), {}, output_.string());
  std::unique_ptr<model::Decoder> decoder = checkpointer.load_model(DType::BF16);
  decoder->set_trainable([](const std::string&) { return true; });
  const std::vector<model::Parameter*> params = decoder->parameters();
  train::SaveRequest host = request("host", *decoder);
  host.trainable = train::host_trainable_values(params);
  const std::string host_dir = checkpointer.save(host);

  // The values as a GPU would hand them (f32, last to first), the host model's released.
  std::vector<std::pair<std::string, Tensor>> downloaded;
  for (const model::Parameter* p : params) downloaded.push_back({p->name, p->value.to(DType::F32)});
  const std::vector<io::TensorSpec> specs = host.trainable.tensors;
  decoder->release_values([](const model::Parameter&) { return true; });
  train::SaveRequest streamed = request("streamed", *decoder);
  int streams = 0;
  streamed.trainable = {specs, [&](const io::TensorSink& sink) {
                          ++streams;
                          for (auto it = downloaded.rbegin(); it != downloaded.rend(); ++it) sink(it->first, it->second);
                        }};
  const std::string streamed_dir = checkpointer.save(streamed);
  EXPECT_EQ(streams, 1);
  expect_same_files(host_dir, streamed_dir);
}

// A sharded LoRA run's frozen base is held a unit at a time (FrozenInTurn): a save that makes the
// merged model's tensors of each group as it is held (three values at a time, every other one
// released) writes the checkpoint a save of the held values writes, byte for byte (DoRA adapters,
// their B moved off zero so that the merges count); a hold that leaves a value out fails the save
// naming it, and leaves no checkpoint behind.
TEST_F(CheckpointerSave, FrozenValuesHeldInTurnWriteTheHeldValuesCheckpointByteForByte) {
  train::HfCheckpointer checkpointer(input_.string(), {}, output_.string());
  const WithDora m = with_dora(checkpointer);
  for (const auto& a : m.adapters)
    for (model::Parameter* p : a->parameters())
      for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] += 0.01f * float(i % 7);
  const std::vector<model::Parameter*>& frozen = m.frozen;
  const std::string held_dir = checkpointer.save(lora_request("held", m));

  const std::vector<io::TensorSpec> specs = train::parameter_specs(frozen);
  std::map<std::string, Tensor> aside;  // the frozen values, released from the model until held
  for (model::Parameter* p : frozen) aside[p->name] = std::exchange(p->value, Tensor());
  auto hold_in_groups = [&](const std::string& left_out) {
    return [&, left_out](const std::function<void(const std::vector<std::string>&)>& held) {
      for (size_t first = 0; first < frozen.size(); first += 3) {
        std::vector<std::string> names;
        for (size_t i = first; i < std::min(first + 3, frozen.size()); ++i) {
          if (frozen[i]->name == left_out) continue;
          frozen[i]->value = aside.at(frozen[i]->name);
          names.push_back(frozen[i]->name);
        }
        held(names);
        for (size_t i = first; i < std::min(first + 3, frozen.size()); ++i) frozen[i]->value = Tensor();
      }
    };
  };
  train::SaveRequest in_turn = lora_request("in_turn", m);
  in_turn.frozen = {specs, hold_in_groups("")};
  const std::string in_turn_dir = checkpointer.save(in_turn);
  expect_same_files(held_dir, in_turn_dir);

  const std::string left_out = frozen[4]->name;
  train::SaveRequest incomplete = lora_request("step_1", m);
  incomplete.frozen = {specs, hold_in_groups(left_out)};
  try {
    checkpointer.save(incomplete);
    FAIL() << "a save with a frozen value never held succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(left_out + " was never held"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(output_ / "step_1"));
  EXPECT_EQ(entries_in(output_), (std::vector<std::string>{"held", "in_turn"})) << "the failed save left something";
}

// A resume continues from the save made last (the state's saved_at, which copies keep), not the larger
// step: a run started afresh where an earlier, longer run left epoch_1 (step 80) and killed after its
// own step_20 resumes from step_20. A state without saved_at (older ktune) counts as older.
TEST_F(CheckpointerSave, TheLatestCheckpointIsTheOneWrittenLastNotTheLargestStep) {
  train::HfCheckpointer checkpointer(input_.string(), {}, output_.string());
  std::unique_ptr<model::Decoder> decoder = checkpointer.load_model(DType::BF16);
  decoder->set_trainable([](const std::string&) { return true; });
  const train::StreamedTensors host = train::host_trainable_values(decoder->parameters());
  train::SaveRequest earlier_run = request("epoch_1", *decoder);
  earlier_run.trainable = host;
  earlier_run.recipe_state = {{"global_step", 80}, {"saved_at", 1800000000.0}};
  const std::string epoch_1 = checkpointer.save(earlier_run);
  train::SaveRequest older_ktune = request("epoch_2", *decoder);  // no saved_at: older than any with one
  older_ktune.trainable = host;
  older_ktune.recipe_state = {{"global_step", 120}};
  const std::string epoch_2 = checkpointer.save(older_ktune);
  EXPECT_EQ(checkpointer.find_latest(), epoch_1);
  train::SaveRequest this_run = request("step_20", *decoder);
  this_run.trainable = host;
  this_run.recipe_state = {{"global_step", 20}, {"saved_at", 1800003600.0}};  // an hour later
  const std::string step_20 = checkpointer.save(this_run);
  EXPECT_EQ(checkpointer.find_latest(), step_20);
  fs::last_write_time(fs::path(epoch_1) / "recipe_state" / "recipe_state.json", fs::file_time_type::clock::now());
  EXPECT_EQ(checkpointer.find_latest(), step_20) << "a copy's file times do not reorder the saves";
}

// torchtune's resume of a full fine-tune names its checkpoint_files under output_dir
// (epoch_N/model-...): accepted there when resuming a full fine-tune, refused otherwise.
TEST_F(CheckpointerSave, TorchtunesResumeFilesUnderTheOutputDirAreAcceptedWhenResuming) {
  fs::create_directories(output_ / "epoch_0");
  std::ofstream(output_ / "epoch_0" / "model-00001-of-00001.safetensors") << "x";
  train::HfCheckpointer checkpointer(input_.string(), {"epoch_0/model-00001-of-00001.safetensors"}, output_.string());
  try {
    checkpointer.load_model(DType::F32);
    ADD_FAILURE() << "a file of the output dir was taken without a resume";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist in " + input_.string()), std::string::npos) << e.what();
  }
  checkpointer.accept_files_under_output_dir(true);
  EXPECT_NE(checkpointer.load_model(DType::F32), nullptr);
}

// A failed save leaves nothing of itself (no partial copy in a hidden temporary directory, which on a
// full disk is what hurts) and the older checkpoint of its name as it was.
TEST_F(CheckpointerSave, AStreamThatLeavesATensorOutFailsTheSaveNamingItAndWritesNoCheckpoint) {
  train::HfCheckpointer checkpointer(input_.string(), {}, output_.string());
  std::unique_ptr<model::Decoder> decoder = checkpointer.load_model(DType::BF16);
  decoder->set_trainable([](const std::string&) { return true; });
  const train::StreamedTensors host = train::host_trainable_values(decoder->parameters());
  const std::string left_out = host.tensors.back().name;
  train::SaveRequest incomplete = request("step_1", *decoder);
  incomplete.trainable = {host.tensors, [&](const io::TensorSink& sink) {
                            host.stream([&](const std::string& name, const Tensor& value) {
                              if (name != left_out) sink(name, value);
                            });
                          }};
  auto expect_save_fails = [&] {
    try {
      checkpointer.save(incomplete);
      ADD_FAILURE() << "a save with a tensor missing succeeded";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("tensor " + left_out), std::string::npos) << message;
      EXPECT_NE(message.find("planned but never written"), std::string::npos) << message;
    }
  };
  expect_save_fails();
  EXPECT_EQ(entries_in(output_), std::vector<std::string>{}) << "the failed save left something";
  EXPECT_FALSE(checkpointer.find_latest().has_value());

  train::SaveRequest whole = request("step_1", *decoder);
  whole.trainable = host;
  const std::string saved = checkpointer.save(whole);
  const std::map<std::string, std::string> before = file_bytes(saved);
  expect_save_fails();
  EXPECT_EQ(entries_in(output_), std::vector<std::string>{"step_1"}) << "the failed save left something";
  EXPECT_TRUE(file_bytes(saved) == before) << "the failed save changed the older step_1";
  EXPECT_EQ(checkpointer.find_latest(), saved);
}

// A run killed in the middle of a save leaves hidden directories: recover_interrupted_saves (rank 0,
// before a resume looks for the latest checkpoint) puts back a checkpoint caught between the save's
// two renames, from the finished temporary or else from the older copy, and removes the rest but a
// save of a process that still runs; it leaves anything else alone, and the second time finds
// nothing new to do.
TEST_F(CheckpointerSave, LeftoversOfKilledSavesAreRestoredOrRemovedBeforeAResumeLooksForTheLatest) {
  train::HfCheckpointer checkpointer(input_.string(), {}, output_.string());
  std::unique_ptr<model::Decoder> decoder = checkpointer.load_model(DType::BF16);
  decoder->set_trainable([](const std::string&) { return true; });
  auto save = [&](const std::string& name, int global_step) {
    train::SaveRequest r = request(name, *decoder);
    r.recipe_state = {{"global_step", global_step}};
    r.trainable = train::host_trainable_values(decoder->parameters());
    return checkpointer.save(r);
  };
  save("epoch_0", 2);
  save("step_1", 1);
  save("step_2", 3);
  const std::map<std::string, std::string> step_1 = file_bytes(output_ / "step_1");
  // step_2 re-saved at step 5, killed between moving the older step_2 aside and renaming the finished one in.
  fs::rename(save("newer", 5), output_ / ".step_2.tmp-99999111");
  fs::rename(output_ / "step_2", output_ / ".step_2.old-99999111");
  const std::map<std::string, std::string> newer = file_bytes(output_ / ".step_2.tmp-99999111");
  // epoch_0 moved aside with no temporary left: it goes back.
  fs::rename(output_ / "epoch_0", output_ / ".epoch_0.old-99999222");
  const std::map<std::string, std::string> epoch_0 = file_bytes(output_ / ".epoch_0.old-99999222");
  // A save that did not finish, and an older step_1 its finished save had not yet removed.
  fs::create_directories(output_ / ".step_3.tmp-99999333" / "recipe_state");
  std::ofstream(output_ / ".step_3.tmp-99999333" / "model-00001-of-00002.safetensors") << "partial";
  fs::create_directories(output_ / ".step_1.old-99999444");
  // A save in progress in another process that runs (this test's parent): left alone.
  const std::string running = ".step_4.tmp-" + std::to_string(getppid());
  fs::create_directories(output_ / running);
  // Not a save's leftovers: left alone.
  fs::create_directories(output_ / ".cache");
  std::ofstream(output_ / ".step_9.tmp-5") << "a file, not a save's directory";

  const std::vector<std::string> changes = checkpointer.recover_interrupted_saves();
  std::string all;
  for (const std::string& c : changes) all += c + "\n";
  EXPECT_EQ(changes.size(), 6u) << all;
  EXPECT_NE(all.find(running + ": left alone (process " + std::to_string(getppid()) + " is running"), std::string::npos)
      << all;
  EXPECT_NE(all.find("step_2: restored from .step_2.tmp-99999111"), std::string::npos) << all;
  EXPECT_NE(all.find("epoch_0: restored from .epoch_0.old-99999222"), std::string::npos) << all;
  EXPECT_NE(all.find(".step_3.tmp-99999333: removed (a save that did not finish)"), std::string::npos) << all;
  std::vector<std::string> expected{".cache", ".step_9.tmp-5", running, "epoch_0", "step_1", "step_2"};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(entries_in(output_), expected);
  EXPECT_TRUE(file_bytes(output_ / "step_2") == newer) << "step_2 is not the finished save";
  EXPECT_TRUE(file_bytes(output_ / "epoch_0") == epoch_0);
  EXPECT_TRUE(file_bytes(output_ / "step_1") == step_1);
  EXPECT_EQ(checkpointer.find_latest(), (output_ / "step_2").string());
  EXPECT_EQ(checkpointer.recover_interrupted_saves().size(), 1u) << "more than the running save's line";
}

// What a run plans a checkpoint to take before it trains (planned_bytes) is what a save then writes:
// the merged model's tensors, the adapter's, the recipe state's (values and both moments) and the
// copied files, byte for byte of tensor data; under save_adapter_weights_only no model. The space
// free is the filesystem's.
TEST_F(CheckpointerSave, ACheckpointsPlannedBytesAreTheTensorDataAndFilesASaveWrites) {
  train::HfCheckpointer checkpointer(input_.string(), {}, output_.string());
  const WithDora m = with_dora(checkpointer);
  std::map<std::string, Tensor> moments;  // as AdamW keeps them: two per value, in its dtype
  for (const model::Parameter* p : m.trainable)
    for (const char* moment : {"exp_avg.", "exp_avg_sq."})
      moments[moment + p->name] = Tensor::zeros(p->value.shape(), DType::F32);
  train::SaveRequest r = lora_request("epoch_0", m);
  r.optimizer_state = train::streamed_as_they_are(moments);
  const fs::path saved = checkpointer.save(r);

  auto tensor_bytes = [](const fs::path& file) {
    io::SafetensorsFile f = io::SafetensorsFile::open(file.string());
    int64_t bytes = 0;
    for (const std::string& name : f.names()) bytes += int64_t(f.info(name).end - f.info(name).begin);
    return bytes;
  };
  int64_t model_bytes = 0, copied = 0;
  for (const auto& e : fs::directory_iterator(saved)) {
    const std::string file = e.path().filename().string();
    if (file.rfind("model-", 0) == 0) model_bytes += tensor_bytes(e.path());
    if (file == "config.json") copied += int64_t(fs::file_size(e.path()));
  }
  const train::CheckpointBytes planned = checkpointer.planned_bytes(r.trainable.tensors, DType::BF16, true, false);
  EXPECT_GT(model_bytes, 0);
  EXPECT_EQ(planned.model, model_bytes);
  EXPECT_EQ(planned.adapter, tensor_bytes(saved / "adapter_model.safetensors"));
  EXPECT_EQ(planned.recipe_state, tensor_bytes(saved / "recipe_state" / "trainable.safetensors") +
                                      tensor_bytes(saved / "recipe_state" / "optimizer.safetensors"));
  EXPECT_EQ(planned.other, copied);
  EXPECT_EQ(checkpointer.planned_bytes(r.trainable.tensors, DType::F32, true, false).model, 2 * model_bytes);
  EXPECT_EQ(checkpointer.planned_bytes(r.trainable.tensors, DType::BF16, true, true).model, 0);

  const std::optional<int64_t> free = checkpointer.free_bytes();
  ASSERT_TRUE(free.has_value());
  EXPECT_GT(*free, 0);
  // A missing output_dir is asked of the nearest folder that exists.
  train::HfCheckpointer elsewhere(input_.string(), {}, (root_ / "not" / "yet").string());
  EXPECT_TRUE(elsewhere.free_bytes().has_value());
}

// An adapter names its base as the Hub repo the model came from (original_repo_id.json, written by
// the downloads as torchtune's `tune download` writes it), so that PEFT finds the base wherever the
// adapter is exported; a model without one is named by its folder; a broken one fails before training.
TEST_F(CheckpointerSave, AnAdapterNamesTheHubRepoTheModelWasDownloadedFromAsItsBase) {
  train::HfCheckpointer checkpointer(input_.string(), {}, output_.string());
  EXPECT_EQ(checkpointer.base_model_name(), fs::absolute(input_).string());
  std::ofstream(input_ / "original_repo_id.json") << R"({"repo_id": "meta-llama/Llama-3.2-1B-Instruct"})";
  EXPECT_EQ(checkpointer.base_model_name(), "meta-llama/Llama-3.2-1B-Instruct");
  const WithDora m = with_dora(checkpointer);
  const fs::path saved = checkpointer.save(lora_request("epoch_0", m));
  std::ifstream config(saved / "adapter_config.json");
  EXPECT_EQ(nlohmann::json::parse(config).at("base_model_name_or_path"), "meta-llama/Llama-3.2-1B-Instruct");
  EXPECT_TRUE(fs::exists(saved / "original_repo_id.json"));  // copied, as torchtune copies it

  std::ofstream(input_ / "original_repo_id.json", std::ios::trunc) << R"({"repo": "meta-llama/Llama-3.2-1B"})";
  try {
    checkpointer.check_copied_files();
    FAIL() << "a repo id file without repo_id was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("original_repo_id.json"), std::string::npos) << e.what();
  }
}

// A save copies the model's other files, but not hidden ones (huggingface_hub's .cache/ of a
// local_dir download, .gitattributes) nor an earlier run's adapter_config.json (a full fine-tune
// started from a LoRA output would carry it next to weights it does not belong to).
TEST_F(CheckpointerSave, HiddenFilesAndAnEarlierAdaptersConfigAreNotCopied) {
  fs::create_directories(input_ / ".cache/huggingface/download");
  std::ofstream(input_ / ".cache/huggingface/download/config.json.metadata") << "etag";
  std::ofstream(input_ / ".gitattributes") << "*.safetensors filter=lfs";
  std::ofstream(input_ / "adapter_config.json") << R"({"peft_type": "LORA", "r": 8})";
  std::ofstream(input_ / "tokenizer_config.json") << "{}";
  train::HfCheckpointer checkpointer(input_.string(), {}, output_.string());
  std::unique_ptr<model::Decoder> decoder = checkpointer.load_model(DType::BF16);
  const fs::path saved = checkpointer.save(request("epoch_0", *decoder));
  EXPECT_TRUE(fs::exists(saved / "config.json"));
  EXPECT_TRUE(fs::exists(saved / "tokenizer_config.json"));
  EXPECT_FALSE(fs::exists(saved / ".cache"));
  EXPECT_FALSE(fs::exists(saved / ".gitattributes"));
  EXPECT_FALSE(fs::exists(saved / "adapter_config.json"));
}

// PEFT's adapter_config.json holds the options as they were written: a float 0.05 is 0.05 there.
TEST(PeftAdapterConfig, FloatOptionsAreWrittenAsTheirShortestDecimal) {
  train::AdapterDescription adapter;
  adapter.options.rank = 8;
  adapter.options.alpha = 16.0f;
  adapter.options.dropout = 0.05f;
  const std::string text = train::peft_adapter_config(adapter, "org/base").dump();
  EXPECT_NE(text.find("\"lora_dropout\":0.05,"), std::string::npos) << text;
  EXPECT_NE(text.find("\"lora_alpha\":16.0,"), std::string::npos) << text;
  EXPECT_NE(text.find("\"base_model_name_or_path\":\"org/base\""), std::string::npos) << text;
}

// A sharded input is saved in the same shards (each tensor in the file of its name in the input's
// index), with an index whose weight_map names every tensor's file and whose total_size is the
// tensors' bytes; transformers loads the folder with no tensor missing or left over.
TEST_F(CheckpointerSave, AShardedInputIsSavedInItsShardsWithAnIndexTransformersLoads) {
  train::HfCheckpointer checkpointer(input_.string(), {}, output_.string());
  std::unique_ptr<model::Decoder> decoder = checkpointer.load_model(DType::F32);
  const fs::path saved = checkpointer.save(request("epoch_0", *decoder));
  const nlohmann::json input_index = nlohmann::json::parse(std::ifstream(input_ / "model.safetensors.index.json"));
  const nlohmann::json index = nlohmann::json::parse(std::ifstream(saved / "model.safetensors.index.json"));
  EXPECT_EQ(index.at("weight_map"), input_index.at("weight_map"));
  std::map<std::string, std::string> file_of;
  for (const auto& [name, file] : index.at("weight_map").items()) file_of[name] = file.get<std::string>();
  std::set<std::string> files;
  for (const auto& [name, file] : file_of) files.insert(file);
  ASSERT_GT(files.size(), 2u);
  uint64_t total = 0;
  size_t tensors = 0;
  for (const std::string& file : files) {
    EXPECT_TRUE(std::regex_match(file, std::regex(R"(model-0000[1-9]-of-0000)" + std::to_string(files.size()) +
                                                  R"(\.safetensors)"))) << file;
    const io::SafetensorsFile shard = io::SafetensorsFile::open((saved / file).string());
    for (const std::string& name : shard.names()) {
      EXPECT_EQ(file_of[name], file) << name;
      total += shard.info(name).end - shard.info(name).begin;
      ++tensors;
    }
  }
  EXPECT_EQ(tensors, file_of.size());
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), total);

  if (std::system("python3 -c 'import transformers' 2>/dev/null") != 0) GTEST_SKIP() << "transformers is not installed";
  const std::string script =
      "import json, sys\n"
      "from transformers import AutoModelForCausalLM\n"
      "m, info = AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)\n"
      "print(json.dumps({k: sorted(v) for k, v in info.items() if k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')}))\n";
  std::ofstream(root_ / "load.py") << script;
  const std::string out = (root_ / "load.json").string();
  ASSERT_EQ(std::system(("python3 '" + (root_ / "load.py").string() + "' '" + saved.string() + "' > '" + out + "' 2>/dev/null").c_str()), 0);
  const nlohmann::json loaded = nlohmann::json::parse(std::ifstream(out));
  for (const auto& [what, keys] : loaded.items()) EXPECT_TRUE(keys.empty()) << what << ": " << keys.dump();
}

}  // namespace
