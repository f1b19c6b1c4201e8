// ktune._ktune: the native half of the Python SDK. It holds one sdk::TrainerClient and converts at
// the boundary: the Python dataclasses of ktune.types (read by attribute name, as upstream's
// kubeflow.trainer spells them) become the C++ structs of runtime/sdk_types.h, and the C++ results
// come back as plain dicts and lists that ktune/client.py turns into dataclasses.
//
// Conversion problems are collected, not thrown one at a time: a call with three bad fields raises
// one ValueError naming all three (as validation does for the TrainJob). Errors map to Python as
// upstream's SDK raises them: validation and bad arguments -> ValueError (with an `errors` list of
// (where, what) pairs), a Failed job while waiting -> RuntimeError, the wait's deadline ->
// TimeoutError, anything else the backend reports -> RuntimeError; the message is always the C++ one.
//
// It deliberately adds no behaviour to TrainerClient: no defaults of its own (those are the
// dataclasses'), no planning, no Python function handling (client.py turns a function into the
// CustomTrainer script). Every backend call releases the GIL (the Kubernetes backend waits on the
// network); short ones share one TrainerClient under a mutex, long ones (wait_for_job_status,
// following logs) run on a TrainerClient of their own, so that other Python threads are not held up.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "hub/exporter.h"
#include "hub/s3_client.h"
#include "hub/storage.h"
#include "hub/storage_uri.h"
#include "runtime/planner.h"
#include "runtime/trainjob_builder.h"
#include "sdk/trainer_client.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ktune::python {

namespace {

// ---- Python objects -> C++ structs ------------------------------------------------------------

// Reads attributes of the Python dataclasses, recording every problem under its field path
// ("trainer.config.batch_size") instead of stopping at the first.
class Reader {
 public:
  std::vector<Error> errors;

  // The class a value is, by name: the nearest ktune or upstream kubeflow class in its type's MRO (a
  // user's subclass of one counts as that class), else its own class's name (a look-alike of the
  // same name passes, as before).
  static std::string type_name(nb::handle h) {
    const nb::handle type = h.type();
    for (nb::handle c : nb::borrow<nb::tuple>(type.attr("__mro__"))) {
      const nb::object module = nb::getattr(c, "__module__", nb::none());
      if (!nb::isinstance<nb::str>(module)) continue;
      const std::string name = nb::cast<std::string>(module);
      if (name.rfind("ktune", 0) == 0 || name.rfind("kubeflow", 0) == 0) return nb::cast<std::string>(c.attr("__name__"));
    }
    return nb::cast<std::string>(type.attr("__name__"));
  }

  // obj.name, or None when obj has no such attribute.
  static nb::object attr(nb::handle obj, const char* name) {
    if (obj.is_none() || !nb::hasattr(obj, name)) return nb::none();
    return obj.attr(name);
  }

  void fail(const std::string& where, const std::string& what) { errors.emplace_back(where, what); }

  std::string describe(nb::handle v) {
    std::string r = nb::cast<std::string>(nb::repr(v));
    if (r.size() > 60) r = r.substr(0, 57) + "...";
    return type_name(v) + " " + r;
  }

  std::optional<std::string> opt_str(nb::handle v, const std::string& where) {
    if (v.is_none()) return std::nullopt;
    if (!nb::isinstance<nb::str>(v)) {
      fail(where, "expected a str, got " + describe(v));
      return std::nullopt;
    }
    return nb::cast<std::string>(v);
  }

  std::string str(nb::handle v, const std::string& where) {
    if (v.is_none()) {
      fail(where, "is required (a str), got None");
      return "";
    }
    return opt_str(v, where).value_or("");
  }

  std::optional<int> opt_int(nb::handle v, const std::string& where) {
    if (v.is_none()) return std::nullopt;
    if (nb::isinstance<nb::bool_>(v) || !nb::isinstance<nb::int_>(v)) {
      fail(where, "expected an int, got " + describe(v));
      return std::nullopt;
    }
    long long x = nb::cast<long long>(v);
    if (x < 0 || x > 1000000000) {
      fail(where, "expected a non-negative int, got " + std::to_string(x));
      return std::nullopt;
    }
    return int(x);
  }

  std::optional<double> opt_float(nb::handle v, const std::string& where) {
    if (v.is_none()) return std::nullopt;
    if (nb::isinstance<nb::bool_>(v) || !(nb::isinstance<nb::float_>(v) || nb::isinstance<nb::int_>(v))) {
      fail(where, "expected a float, got " + describe(v));
      return std::nullopt;
    }
    return nb::cast<double>(v);
  }

  std::optional<bool> opt_bool(nb::handle v, const std::string& where) {
    if (v.is_none()) return std::nullopt;
    if (!nb::isinstance<nb::bool_>(v)) {
      fail(where, "expected a bool, got " + describe(v));
      return std::nullopt;
    }
    return nb::cast<bool>(v);
  }

  std::optional<std::vector<std::string>> opt_str_list(nb::handle v, const std::string& where) {
    if (v.is_none()) return std::nullopt;
    if (nb::isinstance<nb::str>(v) || !(nb::isinstance<nb::list>(v) || nb::isinstance<nb::tuple>(v))) {
      fail(where, "expected a list of str, got " + describe(v));
      return std::nullopt;
    }
    std::vector<std::string> out;
    size_t i = 0;
    for (nb::handle item : v) {
      const std::string w = where + "[" + std::to_string(i++) + "]";
      if (auto s = opt_str(item, w)) out.push_back(*s);
      else if (item.is_none()) fail(w, "expected a str, got None");
    }
    return out;
  }

  // A dict in insertion order; values str() of ints and floats as upstream formats them.
  types::StringDict dict(nb::handle v, const std::string& where, bool numbers_allowed) {
    types::StringDict out;
    if (v.is_none()) return out;
    if (!nb::isinstance<nb::dict>(v)) {
      fail(where, "expected a dict, got " + describe(v));
      return out;
    }
    for (auto [k, val] : nb::borrow<nb::dict>(v)) {
      if (!nb::isinstance<nb::str>(k)) {
        fail(where, "keys must be str, got " + describe(k));
        continue;
      }
      const std::string key = nb::cast<std::string>(k);
      const bool number = (nb::isinstance<nb::int_>(val) || nb::isinstance<nb::float_>(val)) && !nb::isinstance<nb::bool_>(val);
      if (nb::isinstance<nb::str>(val) || (numbers_allowed && number))
        out.emplace_back(key, nb::cast<std::string>(nb::str(val)));
      else
        fail(where + "[" + nb::cast<std::string>(nb::repr(k)) + "]",
             std::string("expected a str") + (numbers_allowed ? " or a number" : "") + ", got " + describe(val));
    }
    return out;
  }

  // An enum member (its .value) or its value as a str; `parse` maps the value, `allowed` names them.
  template <typename E, typename Parse>
  std::optional<E> opt_enum(nb::handle v, const std::string& where, Parse parse, const char* allowed) {
    if (v.is_none()) return std::nullopt;
    nb::object value = nb::hasattr(v, "value") && !nb::isinstance<nb::str>(v) ? v.attr("value") : nb::borrow(v);
    if (!nb::isinstance<nb::str>(value)) {
      fail(where, std::string("expected one of ") + allowed + ", got " + describe(v));
      return std::nullopt;
    }
    std::optional<E> e = parse(nb::cast<std::string>(value));
    if (!e) fail(where, std::string("expected one of ") + allowed + ", got '" + nb::cast<std::string>(value) + "'");
    return e;
  }

  types::LoraConfig lora(nb::handle o, const std::string& w) {
    types::LoraConfig l;
    l.apply_lora_to_mlp = opt_bool(attr(o, "apply_lora_to_mlp"), w + ".apply_lora_to_mlp");
    l.apply_lora_to_output = opt_bool(attr(o, "apply_lora_to_output"), w + ".apply_lora_to_output");
    l.lora_attn_modules = opt_str_list(attr(o, "lora_attn_modules"), w + ".lora_attn_modules").value_or(std::vector<std::string>{});
    l.lora_rank = opt_int(attr(o, "lora_rank"), w + ".lora_rank");
    l.lora_alpha = opt_int(attr(o, "lora_alpha"), w + ".lora_alpha");
    l.lora_dropout = opt_float(attr(o, "lora_dropout"), w + ".lora_dropout");
    l.quantize_base = opt_bool(attr(o, "quantize_base"), w + ".quantize_base");
    l.use_dora = opt_bool(attr(o, "use_dora"), w + ".use_dora");
    return l;
  }

  std::optional<types::DataFormat> source(nb::handle o, const std::string& w) {
    return opt_enum<types::DataFormat>(attr(o, "source"), w + ".source", types::data_format_from_string,
                                       "DataFormat (json, csv, parquet, arrow, text, xml)");
  }

  types::DatasetPreprocessConfig dataset_preprocess(nb::handle o, const std::string& w) {
    if (o.is_none()) return std::monostate{};
    const std::string t = type_name(o);
    if (t == "TorchTuneInstructDataset") {
      types::TorchTuneInstructDataset d;
      d.source = source(o, w);
      d.split = opt_str(attr(o, "split"), w + ".split");
      d.train_on_input = opt_bool(attr(o, "train_on_input"), w + ".train_on_input");
      d.new_system_prompt = opt_str(attr(o, "new_system_prompt"), w + ".new_system_prompt");
      d.column_map = dict(attr(o, "column_map"), w + ".column_map", false);
      return d;
    }
    if (t == "TorchTuneChatDataset") {
      types::TorchTuneChatDataset d;
      d.source = source(o, w);
      d.split = opt_str(attr(o, "split"), w + ".split");
      d.conversation_column = opt_str(attr(o, "conversation_column"), w + ".conversation_column");
      d.conversation_style = opt_str(attr(o, "conversation_style"), w + ".conversation_style");
      d.train_on_input = opt_bool(attr(o, "train_on_input"), w + ".train_on_input");
      d.new_system_prompt = opt_str(attr(o, "new_system_prompt"), w + ".new_system_prompt");
      return d;
    }
    if (t == "TorchTuneMultimodalDataset") {
      types::TorchTuneMultimodalDataset d;
      d.source = source(o, w);
      d.split = opt_str(attr(o, "split"), w + ".split");
      d.column_map = dict(attr(o, "column_map"), w + ".column_map", false);
      d.image_dir = opt_str(attr(o, "image_dir"), w + ".image_dir");
      d.image_tag = opt_str(attr(o, "image_tag"), w + ".image_tag");
      return d;
    }
    fail(w, "expected TorchTuneInstructDataset, TorchTuneChatDataset or TorchTuneMultimodalDataset, got " + describe(o));
    return std::monostate{};
  }

  types::TorchTuneConfig torchtune_config(nb::handle o, const std::string& w) {
    types::TorchTuneConfig c;
    if (o.is_none() || type_name(o) != "TorchTuneConfig") {
      fail(w, "expected a TorchTuneConfig, got " + describe(o));
      return c;
    }
    c.dtype = opt_enum<types::DataType>(attr(o, "dtype"), w + ".dtype", types::data_type_from_string, "DataType (bf16, fp32)");
    c.batch_size = opt_int(attr(o, "batch_size"), w + ".batch_size");
    c.epochs = opt_int(attr(o, "epochs"), w + ".epochs");
    c.loss = opt_enum<types::Loss>(attr(o, "loss"), w + ".loss", types::loss_from_string,
                                   "Loss (torchtune.modules.loss.CEWithChunkedOutputLoss)");
    c.num_nodes = opt_int(attr(o, "num_nodes"), w + ".num_nodes");
    nb::object peft = attr(o, "peft_config");
    if (!peft.is_none()) {
      if (type_name(peft) == "LoraConfig") c.peft_config = lora(peft, w + ".peft_config");
      else fail(w + ".peft_config", "expected a LoraConfig, got " + describe(peft));
    }
    c.dataset_preprocess_config = dataset_preprocess(attr(o, "dataset_preprocess_config"), w + ".dataset_preprocess_config");
    c.resources_per_node = dict(attr(o, "resources_per_node"), w + ".resources_per_node", true);
    return c;
  }

  // The CustomTrainer as client.py hands it over (ktune.types._CustomTrainerSpec): the C++ struct's
  // fields, the function already turned into `script`.
  types::CustomTrainer custom_trainer(nb::handle o, const std::string& w) {
    types::CustomTrainer c;
    c.command = opt_str_list(attr(o, "command"), w + ".command").value_or(std::vector<std::string>{});
    c.script = opt_str(attr(o, "script"), w + ".script").value_or("");
    c.args = opt_str_list(attr(o, "args"), w + ".args").value_or(std::vector<std::string>{});
    c.env = dict(attr(o, "env"), w + ".env", false);
    c.packages_to_install = opt_str_list(attr(o, "packages_to_install"), w + ".packages_to_install").value_or(std::vector<std::string>{});
    if (auto urls = opt_str_list(attr(o, "pip_index_urls"), w + ".pip_index_urls")) c.pip_index_urls = *urls;
    c.num_nodes = opt_int(attr(o, "num_nodes"), w + ".num_nodes");
    c.resources_per_node = dict(attr(o, "resources_per_node"), w + ".resources_per_node", true);
    c.image = opt_str(attr(o, "image"), w + ".image");
    return c;
  }

  // ktune's or upstream's CustomTrainerContainer, by its fields.
  types::CustomTrainerContainer custom_trainer_container(nb::handle o, const std::string& w) {
    types::CustomTrainerContainer c;
    c.image = opt_str(attr(o, "image"), w + ".image").value_or("");
    if (c.image.empty()) fail(w + ".image", "must name the container image to run");
    c.num_nodes = opt_int(attr(o, "num_nodes"), w + ".num_nodes");
    c.resources_per_node = dict(attr(o, "resources_per_node"), w + ".resources_per_node", true);
    c.env = dict(attr(o, "env"), w + ".env", false);
    return c;
  }

  types::Trainer trainer(nb::handle o) {
    if (o.is_none()) return std::monostate{};
    const std::string t = type_name(o);
    if (t == "BuiltinTrainer") return types::BuiltinTrainer{torchtune_config(attr(o, "config"), "trainer.config")};
    if (t == "_CustomTrainerSpec") return custom_trainer(o, "trainer");
    if (t == "CustomTrainerContainer") return custom_trainer_container(o, "trainer");
    fail("trainer", "expected a BuiltinTrainer, a CustomTrainer or a CustomTrainerContainer, got " + describe(o));
    return std::monostate{};
  }

  template <typename Init>
  void s3_fields(Init& s, nb::handle o, const std::string& w) {
    s.endpoint = opt_str(attr(o, "endpoint"), w + ".endpoint");
    s.access_key_id = opt_str(attr(o, "access_key_id"), w + ".access_key_id");
    s.secret_access_key = opt_str(attr(o, "secret_access_key"), w + ".secret_access_key");
    s.region = opt_str(attr(o, "region"), w + ".region");
    s.role_arn = opt_str(attr(o, "role_arn"), w + ".role_arn");
  }

  // Upstream's DataCacheInitializer (ktune's or upstream's class), by its fields.
  types::DataCacheInitializer data_cache(nb::handle o, const std::string& w) {
    types::DataCacheInitializer c;
    c.storage_uri = str(attr(o, "storage_uri"), w + ".storage_uri");
    c.metadata_loc = str(attr(o, "metadata_loc"), w + ".metadata_loc");
    c.num_data_nodes = opt_int(attr(o, "num_data_nodes"), w + ".num_data_nodes").value_or(0);
    c.head_cpu = opt_str(attr(o, "head_cpu"), w + ".head_cpu");
    c.head_mem = opt_str(attr(o, "head_mem"), w + ".head_mem");
    c.worker_cpu = opt_str(attr(o, "worker_cpu"), w + ".worker_cpu");
    c.worker_mem = opt_str(attr(o, "worker_mem"), w + ".worker_mem");
    c.iam_role = opt_str(attr(o, "iam_role"), w + ".iam_role");
    return c;
  }

  // Initializer.dataset or .model (`part`): a HuggingFace<Kind>Initializer or S3<Kind>Initializer,
  // whose fields are the same for both kinds; None stays unset.
  template <typename HuggingFace, typename S3, typename Variant>
  Variant initializer_part(nb::handle o, const std::string& part, const std::string& kind) {
    if (o.is_none()) return std::monostate{};
    const std::string w = "initializer." + part, t = type_name(o);
    if (t == "HuggingFace" + kind + "Initializer") {
      HuggingFace h;
      h.storage_uri = str(attr(o, "storage_uri"), w + ".storage_uri");
      h.ignore_patterns = opt_str_list(attr(o, "ignore_patterns"), w + ".ignore_patterns");
      h.access_token = opt_str(attr(o, "access_token"), w + ".access_token");
      return h;
    }
    if (t == "S3" + kind + "Initializer") {
      S3 s;
      s.storage_uri = str(attr(o, "storage_uri"), w + ".storage_uri");
      s.ignore_patterns = opt_str_list(attr(o, "ignore_patterns"), w + ".ignore_patterns");
      s3_fields(s, o, w);
      return s;
    }
    if constexpr (std::is_same_v<Variant, types::DatasetInitializer>)
      if (t == "DataCacheInitializer") return data_cache(o, w);
    fail(w, "expected a HuggingFace" + kind + "Initializer or S3" + kind + "Initializer" +
                (kind == "Dataset" ? " (or a DataCacheInitializer)" : "") + ", got " + describe(o));
    return std::monostate{};
  }

  std::optional<types::Initializer> initializer(nb::handle o) {
    if (o.is_none()) return std::nullopt;
    if (type_name(o) != "Initializer") {
      fail("initializer", "expected an Initializer, got " + describe(o));
      return std::nullopt;
    }
    types::Initializer init;
    init.dataset = initializer_part<types::HuggingFaceDatasetInitializer, types::S3DatasetInitializer,
                                    types::DatasetInitializer>(attr(o, "dataset"), "dataset", "Dataset");
    init.model = initializer_part<types::HuggingFaceModelInitializer, types::S3ModelInitializer,
                                  types::ModelInitializer>(attr(o, "model"), "model", "Model");
    return init;
  }

  void throw_if_failed() {
    if (!errors.empty()) throw Errors(std::move(errors));
  }
};

// ---- C++ results -> dicts ---------------------------------------------------------------------

nb::dict runtime_dict(const types::Runtime& r) {
  nb::dict trainer;
  trainer["trainer_type"] = types::to_string(r.trainer.trainer_type);
  trainer["framework"] = r.trainer.framework;
  trainer["image"] = r.trainer.image;
  trainer["num_nodes"] = r.trainer.num_nodes;
  trainer["device"] = r.trainer.device;
  trainer["device_count"] = r.trainer.device_count;
  trainer["command"] = r.trainer.command;
  nb::dict d;
  d["name"] = r.name;
  d["trainer"] = trainer;
  d["kind"] = types::to_string(r.kind);
  d["pretrained_model"] = r.pretrained_model ? nb::object(nb::str(r.pretrained_model->c_str())) : nb::object(nb::none());
  return d;
}

nb::dict job_dict(const types::TrainJob& j) {
  nb::list steps;
  for (const types::Step& s : j.steps) {
    nb::dict sd;
    sd["name"] = s.name;
    sd["status"] = s.status ? nb::object(nb::str(s.status->c_str())) : nb::object(nb::none());
    sd["pod_name"] = s.pod_name;
    sd["device"] = s.device;
    sd["device_count"] = s.device_count;
    steps.append(sd);
  }
  nb::dict metrics;
  for (const auto& [k, v] : j.progress.metrics) metrics[k.c_str()] = v;
  nb::dict progress;
  progress["progress_percentage"] =
      j.progress.progress_percentage ? nb::object(nb::int_(*j.progress.progress_percentage)) : nb::object(nb::none());
  progress["estimated_remaining_seconds"] =
      j.progress.estimated_remaining_seconds ? nb::object(nb::int_(*j.progress.estimated_remaining_seconds)) : nb::object(nb::none());
  progress["metrics"] = metrics;
  nb::dict d;
  d["name"] = j.name;
  d["runtime"] = runtime_dict(j.runtime);
  d["steps"] = steps;
  d["num_nodes"] = j.num_nodes;
  d["creation_timestamp"] = j.creation_timestamp;
  d["status"] = j.status;
  d["progress"] = progress;
  return d;
}

// ---- errors -----------------------------------------------------------------------------------

// A ValueError whose `errors` attribute lists (where, what) for each problem.
[[noreturn]] void raise_value_error(const std::string& message, const std::vector<Error>& errors) {
  nb::list pairs;
  for (const Error& e : errors) pairs.append(nb::make_tuple(e.where(), e.what_only()));
  nb::object exc = nb::handle(PyExc_ValueError)(message);
  exc.attr("errors") = pairs;
  PyErr_SetObject(PyExc_ValueError, exc.ptr());
  throw nb::python_error();
}

// Runs f, turning the caller's mistakes into ValueError (everything else is left to the module's
// translator: RuntimeError, TimeoutError).
template <typename F>
auto user_input(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Errors& e) {
    raise_value_error(e.what(), e.errors());
  } catch (const sdk::JobFailedError&) {
    throw;
  } catch (const sdk::WaitTimeoutError&) {
    throw;
  } catch (const Error& e) {
    raise_value_error(e.what(), {e});
  }
}

// Lets Ctrl-C through while C++ waits: called with the GIL released.
void check_signals() {
  nb::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw nb::python_error();
}

// ---- the client ---------------------------------------------------------------------------------

// A plan ready to submit, with the TrainJob it came from.
struct Plan {
  TrainJobPlan plan;
  v1alpha1::TrainJob job;
};

nb::list plan_steps(const TrainJobPlan& p) {
  nb::list out;
  for (const PlanStep& s : p.steps) {
    nb::dict d;
    d["name"] = s.name;
    d["image"] = s.image;
    d["command"] = s.command;
    nb::dict env;
    for (const auto& [k, v] : s.env) env[k.c_str()] = v;
    for (const auto& [k, v] : s.secret_env) env[k.c_str()] = "***";
    d["env"] = env;
    d["working_dir"] = s.working_dir;
    d["depends_on"] = s.depends_on;
    d["node_rank"] = s.node_rank;
    d["num_proc"] = s.num_proc;
    d["device"] = s.device;
    d["device_count"] = s.device_count;
    out.append(d);
  }
  return out;
}

// Streams one step's log: a reader thread (with its own TrainerClient) follows the log and queues
// lines; __next__ waits for one with the GIL released. close() asks the reader to stop at its next
// line; a reader still waiting for one (a quiet step) is left to end with the step.
class LogStream {
 public:
  LogStream(const sdk::BackendConfig& config, const std::string& name, const std::string& step)
      : state_(std::make_shared<State>()) {
    std::shared_ptr<State> st = state_;
    reader_ = std::thread([st, config, name, step] {
      try {
        sdk::TrainerClient client(config);
        client.get_job_logs(name, step, true, [st](const std::string& line) {
          std::lock_guard<std::mutex> lock(st->mutex);
          if (st->stop) return false;
          st->lines.push_back(line);
          st->cv.notify_all();
          return true;
        });
      } catch (...) {
        std::lock_guard<std::mutex> lock(st->mutex);
        st->error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(st->mutex);
      st->done = true;
      st->cv.notify_all();
    });
  }
  ~LogStream() { close(); }

  std::string next() {
    {
      nb::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(state_->mutex);
      while (state_->lines.empty() && !state_->done) {
        state_->cv.wait_for(lock, std::chrono::milliseconds(200));
        lock.unlock();
        check_signals();
        lock.lock();
      }
      if (!state_->lines.empty()) {
        std::string line = std::move(state_->lines.front());
        state_->lines.pop_front();
        return line;
      }
    }
    finish();
    if (state_->error) {
      std::exception_ptr e = state_->error;
      state_->error = nullptr;
      std::rethrow_exception(e);
    }
    throw nb::stop_iteration();
  }

  void close() {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stop = true;
      state_->lines.clear();
    }
    finish();
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::string> lines;
    bool done = false;
    bool stop = false;
    std::exception_ptr error;
  };

  // Joins a reader that has ended; detaches one still waiting for its step's next line (it holds
  // only `state_` and its own client, and returns at that line or when the step ends).
  void finish() {
    if (!reader_.joinable()) return;
    bool done;
    {
      nb::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(state_->mutex);
      done = state_->cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return state_->done; });
    }
    if (done) reader_.join();
    else reader_.detach();
  }

  std::shared_ptr<State> state_;
  std::thread reader_;
};

class Client {
 public:
  explicit Client(const sdk::BackendConfig& config) : config_(config), client_(config) {}

  // On Kubernetes these read the cluster's runtimes: without the GIL, as every call that may wait
  // on the network (other Python threads run meanwhile, a server in this process included).
  nb::list list_runtimes() const {
    nb::list out;
    for (const types::Runtime& r : backend_call([&] { return client_.list_runtimes(); })) out.append(runtime_dict(r));
    return out;
  }
  nb::dict get_runtime(const std::string& name) const {
    return runtime_dict(backend_call([&] { return client_.get_runtime(name); }));
  }

  // What TrainerClient::plan() does (make_trainjob, then build_plan), keeping the TrainJob for its YAML.
  Plan plan(const std::string& runtime_name, nb::handle initializer, nb::handle trainer,
            const types::JobOptions& options) const {
    return user_input([&] {
      Reader reader;
      const std::optional<types::Initializer> init = reader.initializer(initializer);
      const types::Trainer t = reader.trainer(trainer);
      reader.throw_if_failed();
      return backend_call([&] {
        const types::Runtime runtime = client_.get_runtime(runtime_name);
        Plan p;
        p.job = make_trainjob(runtime, init ? &*init : nullptr, t, options);
        p.plan = client_.plan_of(p.job, init ? &*init : nullptr, t, options);
        return p;
      });
    });
  }

  std::string submit(const Plan& plan) {
    return backend_call([&] { return client_.submit(plan.plan); });
  }

  nb::list list_jobs(const std::string& runtime) {
    nb::list out;
    for (const types::TrainJob& j : backend_call([&] { return client_.list_jobs(runtime); })) out.append(job_dict(j));
    return out;
  }
  nb::dict get_job(const std::string& name) { return job_dict(backend_call([&] { return client_.get_job(name); })); }

  std::vector<std::string> get_job_logs(const std::string& name, const std::string& step) {
    return backend_call([&] { return client_.get_job_logs(name, step, false); });
  }
  LogStream* follow_job_logs(const std::string& name, const std::string& step) {
    // A missing job raises here, not on the first next().
    backend_call([&] { return client_.get_job_record(name).name; });
    return new LogStream(config_, name, step);
  }

  nb::dict wait_for_job_status(const std::string& name, const std::vector<std::string>& status, double timeout,
                               double polling_interval, nb::object callback) {
    const std::set<std::string> wanted(status.begin(), status.end());
    std::optional<types::TrainJob> result;
    {
      nb::gil_scoped_release release;
      sdk::TrainerClient own(config_);  // this call may last long: it does not share client_
      auto on_poll = [&](const types::TrainJob& job) {
        check_signals();
        if (callback.is_none()) return;
        nb::gil_scoped_acquire gil;
        callback(job_dict(job));
      };
      try {
        result = own.wait_for_job_status(name, wanted, timeout, polling_interval, on_poll, check_signals);
      } catch (const sdk::JobFailedError&) {
        throw;
      } catch (const sdk::WaitTimeoutError&) {
        throw;
      } catch (const Error& e) {
        // The wait's own complaints about its arguments are the caller's mistake (upstream: ValueError).
        if (e.where() != "wait_for_job_status(" + name + ")") throw;
        nb::gil_scoped_acquire gil;
        raise_value_error(e.what(), {e});
      }
    }
    return job_dict(*result);
  }

  nb::list get_job_events(const std::string& name) {
    nb::list out;
    for (const types::Event& e : backend_call([&] { return client_.get_job_events(name); })) {
      nb::dict d;
      d["involved_object_kind"] = e.involved_object_kind;
      d["involved_object_name"] = e.involved_object_name;
      d["message"] = e.message;
      d["reason"] = e.reason;
      d["event_time"] = e.event_time;
      out.append(d);
    }
    return out;
  }

  void delete_job(const std::string& name, bool remove_workspace) {
    backend_call([&] {
      client_.delete_job(name, remove_workspace);
      return 0;
    });
  }

  // TrainerClient::export_job: `storage` holds the destination's settings by the CLI's flag names
  // without their dashes (hf_token, s3_endpoint, aws_access_key_id, role_arn, ...), over what the
  // environment gives (AWS_*, HF_TOKEN); each exporter log line goes to `on_line` (with the GIL).
  nb::dict export_job(const std::string& name, const std::string& destination, const std::string& parts, int epoch,
                      const std::map<std::string, std::string>& storage, double timeout, nb::object on_line) {
    sdk::ExportRequest request;
    user_input([&] {
      hub::parse_storage_uri(destination);  // a malformed one is the caller's mistake: ValueError
      request.destination = destination;
      request.parts = hub::parse_export_parts(parts);
      request.epoch = epoch;
      request.timeout_seconds = timeout;
      request.while_waiting = check_signals;  // a Ctrl-C ends a cluster export's wait, or a local one mid-file
      request.storage.s3 = hub::s3_options_from_env();
      if (const char* t = std::getenv("HF_TOKEN"); t != nullptr && *t) request.storage.hf_token = t;
      register_secret(request.storage.hf_token);
      for (const auto& [key, value] : storage) {
        std::string flag = "--" + key;
        std::replace(flag.begin(), flag.end(), '_', '-');
        if (!hub::apply_storage_flag(request.storage, flag, value))
          throw Error("export_job(" + key + "=...)", "not a storage setting (hf_token, hf_endpoint, repo_type, revision, "
                                                     "s3_endpoint, s3_region, aws_access_key_id, aws_secret_access_key, "
                                                     "aws_session_token, role_arn, aws_profile, max_attempts)");
      }
      return 0;
    });
    const sdk::ExportRecord r = backend_call([&] {
      return client_.export_job(name, request, [&](const std::string& line) {
        check_signals();  // a Ctrl-C ends the export at its next line
        if (on_line.is_none()) return true;
        nb::gil_scoped_acquire gil;
        on_line(line);
        return true;
      });
    });
    nb::dict d;
    d["id"] = r.id;
    d["status"] = r.status;
    d["destination"] = r.destination;
    d["parts"] = r.parts;
    d["started_at"] = r.started_at;
    d["finished_at"] = r.finished_at;
    d["summary_json"] = r.summary_json;
    return d;
  }

  std::string backend_kind() { return client_.backend().kind(); }

 private:
  // A call into the backend: without the GIL (the Kubernetes backend waits on the network, and a
  // server in this very process, as in tests, needs the GIL to answer), one at a time on client_.
  template <typename F>
  auto backend_call(F&& f) const -> decltype(f()) {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mutex_);
    return f();
  }

  sdk::BackendConfig config_;
  sdk::TrainerClient client_;
  mutable std::mutex mutex_;
};

// The Kubernetes backend's connection settings, where this build's BackendConfig has them (a
// template, so that a BackendConfig without the fields still compiles: the check is on C).
template <typename C>
void apply_kubernetes_connection(C& c, const std::optional<std::string>& kubeconfig,
                                 const std::optional<std::string>& context) {
  if constexpr (requires { c.kubeconfig = std::string(); }) {
    if (kubeconfig) c.kubeconfig = *kubeconfig;
  } else if (kubeconfig) {
    throw Error("BackendConfig.config_file", "this build's Kubernetes backend takes no kubeconfig path");
  }
  if constexpr (requires { c.kubernetes_context = std::string(); }) {
    if (context) c.kubernetes_context = *context;
  } else if (context) {
    throw Error("BackendConfig.context", "this build's Kubernetes backend takes no context");
  }
}

sdk::BackendConfig make_config(const std::string& kind, const std::optional<std::string>& home,
                               const std::optional<std::string>& workspace_root,
                               const std::optional<std::string>& ktune_exe,
                               const std::optional<std::vector<std::string>>& trainer_command,
                               std::optional<double> stop_grace_seconds,
                               const std::optional<std::string>& kubernetes_namespace,
                               const std::optional<std::string>& kubeconfig,
                               const std::optional<std::string>& kubernetes_context) {
  sdk::BackendConfig c = sdk::BackendConfig::from_env();
  if (kind == "local") c.kind = sdk::BackendConfig::Kind::Local;
  else if (kind == "kubernetes") c.kind = sdk::BackendConfig::Kind::Kubernetes;
  else if (!kind.empty()) throw Error("BackendConfig.kind", "expected 'local' or 'kubernetes', got '" + kind + "'");
  if (home) c.home = *home;
  if (workspace_root) c.workspace_root = *workspace_root;
  if (ktune_exe) c.ktune_exe = *ktune_exe;
  if (trainer_command) c.trainer_command = *trainer_command;
  if (stop_grace_seconds) c.stop_grace_seconds = *stop_grace_seconds;
  if (kubernetes_namespace) c.kubernetes_namespace = *kubernetes_namespace;
  apply_kubernetes_connection(c, kubeconfig, kubernetes_context);
  return c;
}

}  // namespace

}  // namespace ktune::python

NB_MODULE(_ktune, m) {
  using namespace ktune;
  using namespace ktune::python;
  m.doc() = "ktune's native SDK (ktune.TrainerClient wraps it; use that instead).";
  // A client still referenced at exit (a daemon thread holding one, a notebook's globals) is not a
  // leak a user can act on; nanobind's warnings about it printed a dozen lines at every such exit.
  nb::set_leak_warnings(false);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const sdk::JobFailedError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const sdk::WaitTimeoutError& e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    } catch (const sdk::NotSupportedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    } catch (const Errors& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

#ifdef KTUNE_BUILD_TREE_EXE
  m.attr("build_tree_ktune_exe") = KTUNE_BUILD_TREE_EXE;
#else
  m.attr("build_tree_ktune_exe") = "";
#endif

  nb::class_<Plan>(m, "Plan", "A planned TrainJob: what train() would run, and the TrainJob object itself.")
      .def_prop_ro("job_name", [](const Plan& p) { return p.plan.job_name; })
      .def_prop_ro("runtime_name", [](const Plan& p) { return p.plan.runtime_name; })
      .def_prop_ro("trainer_type", [](const Plan& p) { return p.plan.trainer_type; })
      .def_prop_ro("num_nodes", [](const Plan& p) { return p.plan.num_nodes; })
      .def_prop_ro("num_proc_per_node", [](const Plan& p) { return p.plan.num_proc_per_node; })
      .def_prop_ro("recipe", [](const Plan& p) { return p.plan.recipe; })
      .def_prop_ro("config", [](const Plan& p) { return p.plan.config; })
      .def_prop_ro("model_key", [](const Plan& p) { return p.plan.model_key; })
      .def_prop_ro("framework", [](const Plan& p) { return p.plan.framework; })
      .def_prop_ro("steps", [](const Plan& p) { return plan_steps(p.plan); })
      .def_prop_ro("trainer_args", [](const Plan& p) {
        return p.job.spec.trainer ? p.job.spec.trainer->args : std::vector<std::string>{};
      })
      .def_prop_ro("trainer_command", [](const Plan& p) {
        return p.job.spec.trainer ? p.job.spec.trainer->command : std::vector<std::string>{};
      })
      .def("to_text", [](const Plan& p) { return p.plan.to_text(); })
      .def("trainjob_yaml", [](const Plan& p) { return render_trainjob_yaml(p.job); });

  nb::class_<LogStream>(m, "LogStream", "Lines of one step's log as they are written (an iterator).")
      .def("__iter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__next__", &LogStream::next)
      .def("close", &LogStream::close);

  nb::class_<Client>(m, "Client")
      .def("__init__",
           [](Client* self, const std::string& kind, std::optional<std::string> home,
              std::optional<std::string> workspace_root, std::optional<std::string> ktune_exe,
              std::optional<std::vector<std::string>> trainer_command, std::optional<double> stop_grace_seconds,
              std::optional<std::string> kubernetes_namespace, std::optional<std::string> kubeconfig,
              std::optional<std::string> kubernetes_context) {
             sdk::BackendConfig c = user_input([&] {
               return make_config(kind, home, workspace_root, ktune_exe, trainer_command, stop_grace_seconds,
                                  kubernetes_namespace, kubeconfig, kubernetes_context);
             });
             // Without the GIL: a Kubernetes backend reads the cluster's runtimes while constructing.
             nb::gil_scoped_release release;
             new (self) Client(c);
           },
           "kind"_a = "", "home"_a = nb::none(), "workspace_root"_a = nb::none(), "ktune_exe"_a = nb::none(),
           "trainer_command"_a = nb::none(), "stop_grace_seconds"_a = nb::none(), "kubernetes_namespace"_a = nb::none(),
           "kubeconfig"_a = nb::none(), "kubernetes_context"_a = nb::none())
      .def("list_runtimes", &Client::list_runtimes)
      .def("get_runtime", &Client::get_runtime, "name"_a)
      .def(
          "plan",
          [](const Client& c, const std::string& runtime, nb::handle initializer, nb::handle trainer,
             const std::string& name, const std::map<std::string, std::string>& labels,
             const std::map<std::string, std::string>& annotations, std::optional<std::int64_t> active_deadline_seconds,
             std::optional<std::vector<std::string>> trainer_command, std::optional<std::vector<std::string>> trainer_args) {
            return c.plan(runtime, initializer, trainer,
                          types::JobOptions{name, labels, annotations, active_deadline_seconds, trainer_command, trainer_args});
          },
          "runtime"_a, "initializer"_a.none(), "trainer"_a.none(), "name"_a = "",
          "labels"_a = std::map<std::string, std::string>{}, "annotations"_a = std::map<std::string, std::string>{},
          "active_deadline_seconds"_a = nb::none(), "trainer_command"_a = nb::none(), "trainer_args"_a = nb::none())
      .def("submit", &Client::submit, "plan"_a)
      .def("list_jobs", &Client::list_jobs, "runtime"_a = "")
      .def("get_job", &Client::get_job, "name"_a)
      .def("get_job_logs", &Client::get_job_logs, "name"_a, "step"_a = "node-0")
      .def("follow_job_logs", &Client::follow_job_logs, "name"_a, "step"_a = "node-0", nb::rv_policy::take_ownership)
      .def("wait_for_job_status", &Client::wait_for_job_status, "name"_a, "status"_a, "timeout"_a,
           "polling_interval"_a, "callback"_a.none())
      .def("get_job_events", &Client::get_job_events, "name"_a)
      .def("delete_job", &Client::delete_job, "name"_a, "remove_workspace"_a = false)
      .def("export_job", &Client::export_job, "name"_a, "destination"_a, "parts"_a, "epoch"_a, "storage"_a, "timeout"_a,
           "on_line"_a.none())
      .def("backend_kind", &Client::backend_kind);
}
