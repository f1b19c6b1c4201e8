// The runtime value of the Jinja engine, with Python's semantics: what a template sees of the JSON
// context (null, bool, integer, float, string, array → list, object → dict keeping insertion order)
// and what templates build themselves (tuples, namespaces, the loop variable, macros and other
// callables, jinja2's Undefined). Containers are shared by reference, as Python's are: a list
// appended to through one name is appended to through all.
//
// The free functions below are Python's builtins on these values: bool(), str(), repr(), ==, <,
// len(), iter(). They raise EvalFault with Python's message where Python raises.
// Deliberately not here: arithmetic (operators.h), filters and methods (builtins.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ktune::jinja {

class Value;
class Renderer;

// The arguments of a call: f(1, 2, key=3).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using NativeFunction = std::function<Value(Renderer& renderer, const CallArgs& args)>;

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
};

// A dict in insertion order. Keys are compared with Python's ==, so 1, 1.0 and True are one key.
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  void set(const Value& key, Value value);
  bool erase(const Value& key);
};

// An object with named attributes: jinja2's Namespace (assignable) and a for loop's `loop`.
struct ObjectData {
  std::string type_name;  // "Namespace", "LoopContext"
  bool assignable = false;
  std::vector<std::pair<std::string, Value>> attrs;
  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value value);
};

struct CallableData {
  std::string name;
  NativeFunction fn;
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kObject, kCallable };

  Value() = default;  // an Undefined with no hint
  // hint is jinja2's message for it ("'x' is undefined"); strict: StrictUndefined; unsafe: the
  // sandbox refused the attribute (using it raises SecurityError, not UndefinedError).
  static Value undefined(std::string hint, bool strict, bool unsafe = false);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  static Value markup(std::string s);  // markupsafe.Markup: a string already escaped
  static Value new_list(std::vector<Value> items = {});
  static Value new_tuple(std::vector<Value> items);
  static Value new_dict();
  static Value new_object(std::string type_name, bool assignable);
  static Value callable(std::string name, NativeFunction fn);
  static Value from_json(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }  // list or tuple
  bool is_tuple() const { return kind_ == Kind::kList && list_->is_tuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_markup() const { return markup_; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? int64_t(bool_) : int_; }  // bool or int
  double as_float() const;                                                          // any number
  const std::string& as_string() const { return string_; }
  ListData& list() const { return *list_; }
  DictData& dict() const { return *dict_; }
  ObjectData& object() const { return *object_; }
  const CallableData& callable() const { return *callable_; }

  const std::string& undefined_hint() const { return string_; }
  bool strict_undefined() const { return strict_; }
  // Raises what using this Undefined raises: UndefinedError (or SecurityError) with its hint.
  [[noreturn]] void fail_undefined() const;

  // Python's `is`: the same container, or the same singleton (None, True, False).
  bool same_as(const Value& other) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool markup_ = false;
  bool strict_ = false;
  bool unsafe_ = false;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string string_;  // a string's text, or an Undefined's hint
  std::shared_ptr<ListData> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<ObjectData> object_;
  std::shared_ptr<CallableData> callable_;
};

// Python's type(v).__name__: "int", "str", "dict", "NoneType", "Undefined", ...
std::string type_name(const Value& v);
// How jinja2 names an object in "has no attribute" messages: "dict object", "None", ...
std::string object_type_repr(const Value& v);
bool truthy(const Value& v);                   // bool(v)
std::string to_str(const Value& v);            // str(v)
std::string repr(const Value& v);              // repr(v), with Python's quoting of strings
std::string python_float_repr(double d);       // repr(1.0) == "1.0", repr(1e16) == "1e+16"
bool equals(const Value& a, const Value& b);   // a == b
// Python's ordering: negative, zero or positive; TypeError naming op where Python has none.
int compare(const Value& a, const Value& b, const char* op);
int64_t length(const Value& v);                // len(v): code points for a string
std::vector<Value> iterate(const Value& v);    // list(iter(v)): a dict's keys, a string's characters
bool contains(const Value& container, const Value& item);  // item in container

}  // namespace ktune::jinja
