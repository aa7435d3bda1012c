#include "engine/io/torch_pickle.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/error.h"
#include "engine/io/zip_archive.h"

namespace adjoint {

namespace {

// ---------------------------------------------------------------------------------------
// What the unpickler builds: plain data, the few functions it may call, and what calling
// them gives (storages and tensors, as references into the archive, not yet read).

// The globals a pickle may name, and what each is.
enum class Callable {
  OrderedDict,       // collections.OrderedDict(): an empty dict
  RebuildTensorV2,   // (storage, offset, size, stride, requires_grad, hooks[, metadata]) → tensor
  RebuildTensor,     // (storage, offset, size, stride) → tensor
  RebuildParameter,  // (tensor, requires_grad, hooks) → that tensor
  Parameter,         // torch.nn.Parameter(tensor[, requires_grad]), by NEWOBJ → that tensor
  Storage,           // a typed storage class, named in a storage's persistent id
};

// torch's typed storages of real numbers, with the dtype (safetensors' name) of their elements.
struct StorageClass {
  const char* global;
  const char* dtype;
};
constexpr StorageClass kStorageClasses[] = {
    {"torch.FloatStorage", "F32"}, {"torch.HalfStorage", "F16"},  {"torch.BFloat16Storage", "BF16"},
    {"torch.DoubleStorage", "F64"}, {"torch.LongStorage", "I64"}, {"torch.IntStorage", "I32"},
    {"torch.ShortStorage", "I16"},  {"torch.CharStorage", "I8"},  {"torch.ByteStorage", "U8"},
    {"torch.BoolStorage", "BOOL"},
};

struct Global {
  const char* name;
  Callable callable;
};
constexpr Global kGlobals[] = {
    {"collections.OrderedDict", Callable::OrderedDict},
    {"torch._utils._rebuild_tensor_v2", Callable::RebuildTensorV2},
    {"torch._utils._rebuild_tensor", Callable::RebuildTensor},
    {"torch._utils._rebuild_parameter", Callable::RebuildParameter},
    {"torch.nn.parameter.Parameter", Callable::Parameter},
};

struct Value {
  enum class Kind { None, Bool, Int, Float, String, Bytes, Tuple, List, Dict, Global, Storage, Tensor };
  Kind kind = Kind::None;
  int64_t integer = 0;                        // Bool, Int
  double number = 0;                          // Float
  std::string text;                           // String, Bytes; Global: its dotted name; Storage: its key
  std::vector<Value*> items;                  // Tuple, List
  std::vector<std::pair<Value*, Value*>> pairs;  // Dict, in insertion order
  Callable callable = Callable::OrderedDict;  // Global
  const char* dtype = nullptr;                // Global (a storage class), Storage
  int64_t numel = 0;                          // Storage: its element count
  const Value* storage = nullptr;             // Tensor
  int64_t offset = 0;                         // Tensor: in elements of its storage
  Shape size, stride;                         // Tensor
};

const char* kind_name(Value::Kind kind) {
  static constexpr const char* names[] = {"None", "bool", "int", "float", "str", "bytes", "tuple",
                                          "list", "dict", "global", "storage", "tensor"};
  return names[static_cast<int>(kind)];
}

// "an int", "a dict", ...: a value of that kind, for messages.
std::string a_kind(Value::Kind kind) { return cat(kind == Value::Kind::Int ? "an " : "a ", kind_name(kind)); }

// ---------------------------------------------------------------------------------------
// The unpickler: the opcodes of pickle protocol 2 that a state dict uses (the set
// torch.load(weights_only=True) accepts) and BINFLOAT, for the floats a training script
// saves beside its weights.

class Unpickler {
public:
  Unpickler(const std::vector<unsigned char>& bytes, std::string where) : bytes_(bytes), where_(std::move(where)) {}

  // The pickled object.
  const Value* load() {
    while (true) {
      const size_t at = position_;
      const unsigned char op = next(1)[0];
      switch (op) {
        case 0x80: next(1); break;  // PROTO
        case '.': {                 // STOP
          const Value* result = pop("STOP");
          return result;
        }
        case 'c': push_global(at); break;
        case 'q': memo_[next(1)[0]] = top("BINPUT"); break;
        case 'r': memo_[read_u32()] = top("LONG_BINPUT"); break;
        case 'h': push(memo_get(next(1)[0])); break;
        case 'j': push(memo_get(read_u32())); break;
        case 'N': push(make(Value::Kind::None)); break;
        case 0x88: push(make_int(Value::Kind::Bool, 1)); break;  // NEWTRUE
        case 0x89: push(make_int(Value::Kind::Bool, 0)); break;  // NEWFALSE
        case 'K': push(make_int(Value::Kind::Int, next(1)[0])); break;  // BININT1
        case 'M': {                                                      // BININT2
          const unsigned char* p = next(2);
          push(make_int(Value::Kind::Int, p[0] | p[1] << 8));
          break;
        }
        case 'J': push(make_int(Value::Kind::Int, static_cast<int32_t>(read_u32()))); break;  // BININT
        case 0x8a: push_long(); break;                                                         // LONG1
        case 'G': {                                                                           // BINFLOAT, big-endian
          uint64_t bits = 0;
          const unsigned char* p = next(8);
          for (int i = 0; i < 8; ++i) bits = bits << 8 | p[i];
          Value* v = make(Value::Kind::Float);
          v->number = std::bit_cast<double>(bits);
          push(v);
          break;
        }
        case 'X': {  // BINUNICODE
          const uint32_t length = read_u32();
          push_text(Value::Kind::String, length);
          break;
        }
        case 'U': push_text(Value::Kind::Bytes, next(1)[0]); break;  // SHORT_BINSTRING
        case ')': push(make(Value::Kind::Tuple)); break;
        case ']': push(make(Value::Kind::List)); break;
        case '}': push(make(Value::Kind::Dict)); break;
        case 0x8f: push(make(Value::Kind::List)); break;  // EMPTY_SET: a list will do
        case '(': marks_.push_back(stack_.size()); break;
        case 't': push(make_sequence(Value::Kind::Tuple, pop_mark("TUPLE"))); break;
        case 0x85: case 0x86: case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
          const size_t count = op - 0x84;
          need(count, "TUPLEn");
          std::vector<Value*> items(stack_.end() - long(count), stack_.end());
          stack_.resize(stack_.size() - count);
          push(make_sequence(Value::Kind::Tuple, std::move(items)));
          break;
        }
        case 'a': {  // APPEND
          Value* item = pop("APPEND");
          container("APPEND", Value::Kind::List)->items.push_back(item);
          break;
        }
        case 'e': {  // APPENDS
          std::vector<Value*> items = pop_mark("APPENDS");
          Value* list = container("APPENDS", Value::Kind::List);
          list->items.insert(list->items.end(), items.begin(), items.end());
          break;
        }
        case 's': {  // SETITEM
          Value* value = pop("SETITEM");
          Value* key = pop("SETITEM");
          container("SETITEM", Value::Kind::Dict)->pairs.emplace_back(key, value);
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<Value*> items = pop_mark("SETITEMS");
          if (items.size() % 2 != 0) fail(at, "SETITEMS with an odd number of items");
          Value* dict = container("SETITEMS", Value::Kind::Dict);
          for (size_t i = 0; i < items.size(); i += 2) dict->pairs.emplace_back(items[i], items[i + 1]);
          break;
        }
        case 'R': reduce(at); break;
        case 0x81: new_object(at); break;  // NEWOBJ
        case 'b': {                        // BUILD: the state of a dict (OrderedDict's _metadata) or a tensor
          pop("BUILD");
          const Value* object = top("BUILD");
          if (object->kind != Value::Kind::Dict && object->kind != Value::Kind::Tensor)
            fail(at, cat("BUILD on ", a_kind(object->kind), " (only dicts and tensors take a state)"));
          break;
        }
        case 'Q': persistent_id(at); break;  // BINPERSID
        default:
          fail(at, cat("opcode 0x", hex(op), " is not one a state dict uses (pickle protocol 2)"));
      }
    }
  }

private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw Error(cat(where_, "data.pkl at byte ", at, ": ", what));
  }
  static std::string hex(unsigned char byte) {
    const char* digits = "0123456789abcdef";
    return {digits[byte >> 4], digits[byte & 15]};
  }

  const unsigned char* next(size_t count) {
    if (bytes_.size() - position_ < count) fail(position_, "the pickle ends early (truncated?)");
    const unsigned char* p = bytes_.data() + position_;
    position_ += count;
    return p;
  }
  uint32_t read_u32() {
    const unsigned char* p = next(4);
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  }
  // A newline-terminated line (GLOBAL's module and name).
  std::string read_line() {
    const auto begin = bytes_.begin() + long(position_);
    const auto end = std::find(begin, bytes_.end(), '\n');
    if (end == bytes_.end()) fail(position_, "GLOBAL without its newline (truncated?)");
    position_ = size_t(end - bytes_.begin()) + 1;
    return std::string(begin, end);
  }

  Value* make(Value::Kind kind) {
    values_.emplace_back();
    values_.back().kind = kind;
    return &values_.back();
  }
  Value* make_int(Value::Kind kind, int64_t integer) {
    Value* v = make(kind);
    v->integer = integer;
    return v;
  }
  Value* make_sequence(Value::Kind kind, std::vector<Value*> items) {
    Value* v = make(kind);
    v->items = std::move(items);
    return v;
  }

  void push(Value* v) { stack_.push_back(v); }
  void need(size_t count, const char* op) const {
    const size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() - floor < count) fail(position_ - 1, cat(op, " on a stack with too few items"));
  }
  Value* pop(const char* op) {
    need(1, op);
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value* top(const char* op) const {
    need(1, op);
    return stack_.back();
  }
  Value* container(const char* op, Value::Kind kind) const {
    Value* v = top(op);
    if (v->kind != kind) fail(position_ - 1, cat(op, " on ", a_kind(v->kind), ", expected ", a_kind(kind)));
    return v;
  }
  std::vector<Value*> pop_mark(const char* op) {
    if (marks_.empty()) fail(position_ - 1, cat(op, " without a MARK"));
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<Value*> items(stack_.begin() + long(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }
  Value* memo_get(uint32_t index) const {
    auto it = memo_.find(index);
    if (it == memo_.end()) fail(position_ - 1, cat("memo entry ", index, " read before it was written"));
    return it->second;
  }

  void push_text(Value::Kind kind, uint32_t length) {
    const unsigned char* p = next(length);
    Value* v = make(kind);
    v->text.assign(reinterpret_cast<const char*>(p), length);
    push(v);
  }

  // LONG1: a little-endian two's-complement integer of n bytes.
  void push_long() {
    const size_t at = position_ - 1;
    const unsigned n = next(1)[0];
    if (n > 8) fail(at, cat("an integer of ", n, " bytes, more than 64 bits"));
    const unsigned char* p = next(n);
    uint64_t bits = 0;
    for (unsigned i = n; i-- > 0;) bits = bits << 8 | p[i];
    if (n > 0 && n < 8 && (p[n - 1] & 0x80)) bits |= ~uint64_t(0) << (8 * n);  // sign-extend
    push(make_int(Value::Kind::Int, static_cast<int64_t>(bits)));
  }

  // GLOBAL: only the names in kGlobals and kStorageClasses.
  void push_global(size_t at) {
    const std::string module = read_line();
    const std::string name = module + "." + read_line();
    Value* v = make(Value::Kind::Global);
    v->text = name;
    for (const Global& global : kGlobals)
      if (name == global.name) {
        v->callable = global.callable;
        push(v);
        return;
      }
    for (const StorageClass& storage : kStorageClasses)
      if (name == storage.global) {
        v->callable = Callable::Storage;
        v->dtype = storage.dtype;
        push(v);
        return;
      }
    refuse_global(at, name);
  }

  // Names the refused global; when it is a class the pickle goes on to instantiate with
  // NEWOBJ (after memoising it and pushing its arguments), the file is a pickled object, as
  // torch.save(model) writes.
  [[noreturn]] void refuse_global(size_t at, const std::string& name) {
    size_t p = position_;
    if (p < bytes_.size() && bytes_[p] == 'q') p += 2;
    else if (p < bytes_.size() && bytes_[p] == 'r') p += 5;
    const bool instantiated = p + 1 < bytes_.size() && bytes_[p] == ')' && bytes_[p + 1] == 0x81;
    if (instantiated)
      throw Error(cat(where_, "holds a pickled object of class ", name,
                      ", not a state dict (a whole model saved with torch.save(model)?); save model.state_dict() "
                      "instead and load that"));
    fail(at, cat("refuses the global '", name,
                 "': a state dict needs only collections.OrderedDict, torch's tensor rebuilders and typed storages, "
                 "so nothing else is run"));
  }

  static int64_t integer(const Value* v, const char* what, const std::function<void(const std::string&)>& bad) {
    if (v->kind != Value::Kind::Int) bad(cat(what, " is ", a_kind(v->kind), ", expected an int"));
    return v->integer;
  }
  static Shape integers(const Value* v, const char* what, const std::function<void(const std::string&)>& bad) {
    if (v->kind != Value::Kind::Tuple) bad(cat(what, " is ", a_kind(v->kind), ", expected a tuple"));
    Shape out;
    for (const Value* item : v->items) out.push_back(integer(item, what, bad));
    return out;
  }

  // REDUCE: calls the global under its argument tuple.
  void reduce(size_t at) {
    Value* args = pop("REDUCE");
    Value* function = top("REDUCE");
    if (function->kind != Value::Kind::Global) fail(at, cat("REDUCE calls ", a_kind(function->kind)));
    if (args->kind != Value::Kind::Tuple) fail(at, cat("REDUCE with ", kind_name(args->kind), " arguments"));
    const auto bad = [&](const std::string& what) { fail(at, cat(function->text, ": ", what)); };
    const std::vector<Value*>& a = args->items;
    Value* result = nullptr;
    switch (function->callable) {
      case Callable::OrderedDict:
        if (!a.empty()) bad("called with arguments");
        result = make(Value::Kind::Dict);
        break;
      case Callable::RebuildTensorV2:
      case Callable::RebuildTensor: {
        const size_t expected = function->callable == Callable::RebuildTensor ? 4 : 6;
        if (a.size() != expected && !(expected == 6 && a.size() == 7))
          bad(cat(a.size(), " arguments, expected ", expected));
        if (a[0]->kind != Value::Kind::Storage) bad(cat("its storage is ", a_kind(a[0]->kind)));
        result = make(Value::Kind::Tensor);
        result->storage = a[0];
        result->offset = integer(a[1], "its storage offset", bad);
        result->size = integers(a[2], "its size", bad);
        result->stride = integers(a[3], "its stride", bad);
        if (result->size.size() != result->stride.size())
          bad(cat("size ", result->size, " and stride ", result->stride, " differ in length"));
        break;
      }
      case Callable::RebuildParameter:
        if (a.size() != 3 || a[0]->kind != Value::Kind::Tensor) bad("expected (tensor, requires_grad, hooks)");
        result = a[0];
        break;
      case Callable::Parameter:
      case Callable::Storage:
        bad("is not called this way in a state dict");
    }
    stack_.back() = result;
  }

  // NEWOBJ: only torch.nn.Parameter(tensor[, requires_grad]).
  void new_object(size_t at) {
    Value* args = pop("NEWOBJ");
    Value* cls = pop("NEWOBJ");
    if (cls->kind != Value::Kind::Global || cls->callable != Callable::Parameter)
      fail(at, cat("NEWOBJ instantiates ", cls->kind == Value::Kind::Global ? cls->text : kind_name(cls->kind),
                   "; only torch.nn.Parameter is built this way"));
    if (args->kind != Value::Kind::Tuple || args->items.empty() || args->items[0]->kind != Value::Kind::Tensor)
      fail(at, "torch.nn.Parameter without a tensor");
    push(args->items[0]);
  }

  // BINPERSID: ("storage", storage class, key, location, element count).
  void persistent_id(size_t at) {
    const Value* id = pop("BINPERSID");
    const std::vector<Value*>& a = id->items;
    const bool storage = id->kind == Value::Kind::Tuple && a.size() == 5 &&
                         (a[0]->kind == Value::Kind::String || a[0]->kind == Value::Kind::Bytes) &&
                         a[0]->text == "storage";
    if (!storage) fail(at, "a persistent id other than ('storage', class, key, location, count)");
    if (a[1]->kind != Value::Kind::Global || a[1]->callable != Callable::Storage)
      fail(at, "a storage whose class is not a typed storage of real numbers");
    if (a[2]->kind != Value::Kind::String && a[2]->kind != Value::Kind::Bytes) fail(at, "a storage key that is not a string");
    if (a[4]->kind != Value::Kind::Int || a[4]->integer < 0) fail(at, "a storage whose element count is not a count");
    Value* v = make(Value::Kind::Storage);
    v->text = a[2]->text;
    v->dtype = a[1]->dtype;
    v->numel = a[4]->integer;
    push(v);
  }

  const std::vector<unsigned char>& bytes_;
  std::string where_;
  size_t position_ = 0;
  std::deque<Value> values_;  // owns every value; the others point into it (cycles cannot leak)
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  std::map<uint32_t, Value*> memo_;
};

// ---------------------------------------------------------------------------------------
// From the pickled tensors to float32 tensors.

// The element count of `size`, or -1 when it overflows.
int64_t checked_numel(const Shape& size) {
  int64_t n = 1;
  for (int64_t extent : size)
    if (extent < 0 || __builtin_mul_overflow(n, extent, &n)) return -1;
  return n;
}

class Storages {
public:
  Storages(const ZipArchive& zip, std::string prefix, bool big_endian, std::string where)
      : zip_(zip), prefix_(std::move(prefix)), big_endian_(big_endian), where_(std::move(where)) {}

  // Checks what the file says of tensor `name` without reading its values: its storage's
  // entry is there and holds the storage's elements, and the view lies inside it.
  void check(const std::string& name, const Value& t) const {
    const Value& storage = *t.storage;
    const std::string at = cat(where_, "tensor '", name, "': ");
    const int64_t element = dtype_size(storage.dtype);
    const ZipArchive::Entry& entry = entry_of(storage, at);
    int64_t needed = 0;
    if (__builtin_mul_overflow(storage.numel, element, &needed) || entry.size < uint64_t(needed))
      throw Error(cat(at, "storage '", storage.text, "' holds ", entry.size, " bytes, fewer than its ", storage.numel,
                      " elements of ", storage.dtype, " need (a storage shorter than its tensor)"));
    const int64_t numel = checked_numel(t.size);
    if (numel < 0) throw Error(cat(at, "size ", t.size, " is negative or overflows"));
    // A view may repeat elements (a stride of 0), but no parameter or buffer does; refusing
    // such views also bounds what is allocated by the file's size.
    if (numel > storage.numel)
      throw Error(cat(at, "size ", t.size, " has ", numel, " elements, more than the ", storage.numel,
                      " its storage '", storage.text, "' holds (a view repeating elements, not a parameter)"));
    if (t.offset < 0) throw Error(cat(at, "storage offset ", t.offset, " is negative"));
    // The last element the view reaches must lie inside the storage.
    int64_t last = t.offset;
    for (size_t d = 0; d < t.size.size(); ++d) {
      int64_t reach = 0;
      if (t.stride[d] < 0) throw Error(cat(at, "stride ", t.stride, " has a negative step"));
      if (t.size[d] > 0 && (__builtin_mul_overflow(t.size[d] - 1, t.stride[d], &reach) ||
                            __builtin_add_overflow(last, reach, &last)))
        throw Error(cat(at, "size ", t.size, " with stride ", t.stride, " overflows"));
    }
    if (numel > 0 && last >= storage.numel)
      throw Error(cat(at, "size ", t.size, ", stride ", t.stride, " and offset ", t.offset, " reach element ", last,
                      " of storage '", storage.text, "', which holds ", storage.numel, " (a storage shorter than its tensor)"));
  }

  // Tensor `name`, checked first, as float32 into `out`: its elements gathered from its
  // storage by offset and stride.
  void read_into(const std::string& name, const Value& t, float* out) {
    const Value& storage = *t.storage;
    const int64_t element = dtype_size(storage.dtype);
    const int64_t numel = checked_numel(t.size);
    if (numel == 0) return;
    const unsigned char* bytes = bytes_of(storage, cat(where_, "tensor '", name, "': "));
    const size_t dims = t.size.size();
    bool row_major = true;
    for (int64_t d = int64_t(dims) - 1, step = 1; d >= 0; step *= t.size[size_t(d)], --d)
      row_major = row_major && (t.size[size_t(d)] == 1 || t.stride[size_t(d)] == step);
    // A row-major little-endian tensor (what torch.save writes for a parameter) is converted
    // straight from the storage's bytes; any other is first gathered and swapped.
    if (row_major && !big_endian_) {
      convert_to_float(storage.dtype, bytes + t.offset * element, out, size_t(numel));
      return;
    }
    // Gathered in row-major order into raw bytes, swapped to little-endian, then converted.
    std::vector<unsigned char> raw(size_t(numel * element));
    Shape index(dims, 0);
    if (row_major) std::memcpy(raw.data(), bytes + t.offset * element, raw.size());
    else for (int64_t i = 0; i < numel; ++i) {
      int64_t source = t.offset;
      for (size_t d = 0; d < dims; ++d) source += index[d] * t.stride[d];
      std::memcpy(raw.data() + i * element, bytes + source * element, size_t(element));
      for (size_t d = dims; d-- > 0;) {
        if (++index[d] < t.size[d]) break;
        index[d] = 0;
      }
    }
    if (big_endian_)
      for (auto it = raw.begin(); it != raw.end(); it += element) std::reverse(it, it + element);
    convert_to_float(storage.dtype, raw.data(), out, size_t(numel));
  }

private:
  const ZipArchive::Entry& entry_of(const Value& storage, const std::string& at) const {
    const std::string entry_name = prefix_ + "data/" + storage.text;
    const ZipArchive::Entry* entry = zip_.find(entry_name);
    if (entry == nullptr) throw Error(cat(at, "its storage '", storage.text, "' has no entry ", entry_name));
    return *entry;
  }

  // The bytes of `storage`, found and checked against their CRC once, whichever tensor on
  // it is read first. No lock is held while they are checked: the CRC runs over the threads,
  // whose tasks may meanwhile read other tensors, on this storage too; two that check the same
  // storage at once both find it sound, and the first to finish is kept.
  const unsigned char* bytes_of(const Value& storage, const std::string& at) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = loaded_.find(storage.text);
      if (it != loaded_.end()) return it->second.data();
    }
    ZipArchive::Content content = zip_.content(entry_of(storage, at));
    std::lock_guard<std::mutex> lock(mutex_);
    return loaded_.try_emplace(storage.text, std::move(content)).first->second.data();
  }

  const ZipArchive& zip_;
  std::string prefix_;
  bool big_endian_;
  std::string where_;
  std::mutex mutex_;  // guards loaded_
  std::map<std::string, ZipArchive::Content> loaded_;
};

std::string keys_of(const Value& dict) {
  std::string keys;
  size_t shown = 0;
  for (const auto& [key, value] : dict.pairs) {
    if (shown++ == 12) return keys + ", ...";
    keys += (keys.empty() ? "" : ", ") +
            (key->kind == Value::Kind::String ? key->text : cat("<", kind_name(key->kind), ">"));
  }
  return keys;
}

bool starts_with_bytes(const std::string& path, const unsigned char* magic, size_t length) {
  std::ifstream file(path, std::ios::binary);
  std::vector<char> head(length);
  return file.read(head.data(), std::streamsize(length)) && std::memcmp(head.data(), magic, length) == 0;
}

}  // namespace

bool is_torch_zip_file(const std::string& path) { return ZipArchive::looks_like_zip(path); }

bool is_legacy_torch_file(const std::string& path) {
  // PROTO 2, LONG1 of 10 bytes: 0x1950a86a20f9469cfc6c, little-endian.
  static constexpr unsigned char magic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                            0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
  return starts_with_bytes(path, magic, sizeof magic);
}

namespace {

// An open torch.save file: its archive, its pickle and the values built from it, which its
// tensors are read from when asked.
struct TorchFile {
  explicit TorchFile(const std::string& path) : where(cat("torch file ", path, ": ")), zip(path) {}
  std::string where;
  ZipArchive zip;
  std::vector<unsigned char> pickle;
  std::unique_ptr<Unpickler> unpickler;  // owns the values
  std::unique_ptr<Storages> storages;
};

}  // namespace

StoredTensors open_torch_state_dict(const std::string& path, const std::string& key) {
  const auto file = std::make_shared<TorchFile>(path);
  const std::string& where = file->where;
  const ZipArchive& zip = file->zip;

  // TorchScript's archives hold a data.pkl too, of a scripted module.
  for (const ZipArchive::Entry& entry : zip.entries())
    if (entry.name.ends_with("/constants.pkl"))
      throw Error(cat(where, "is a TorchScript archive (torch.jit.save), not a state dict; save "
                             "model.state_dict() with torch.save and load that"));

  // The archive's folder: the one holding data.pkl.
  std::string prefix;
  for (const ZipArchive::Entry& entry : zip.entries()) {
    const size_t slash = entry.name.find('/');
    if (slash != std::string::npos && entry.name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      prefix = entry.name.substr(0, slash + 1);
      break;
    }
  }
  if (prefix.empty()) throw Error(cat(where, "a zip archive without <name>/data.pkl, so not one torch.save wrote"));

  bool big_endian = false;
  if (const ZipArchive::Entry* order = zip.find(prefix + "byteorder")) {
    const std::vector<unsigned char> text = zip.read(*order);
    const std::string byteorder(text.begin(), text.end());
    if (byteorder != "little" && byteorder != "big")
      throw Error(cat(where, "byteorder is '", byteorder, "', expected little or big"));
    big_endian = byteorder == "big";
  }

  file->pickle = zip.read(*zip.find(prefix + "data.pkl"));
  file->unpickler = std::make_unique<Unpickler>(file->pickle, where);
  const Value* root = file->unpickler->load();

  const Value* state = root;
  if (!key.empty()) {
    if (root->kind != Value::Kind::Dict)
      throw Error(cat(where, "--weights-key '", key, "' given, but the file holds ", a_kind(root->kind), ", not a dict"));
    state = nullptr;
    for (const auto& [k, v] : root->pairs)
      if (k->kind == Value::Kind::String && k->text == key) state = v;
    if (state == nullptr) throw Error(cat(where, "no key '", key, "' in the saved dict (its keys: ", keys_of(*root), ")"));
  }
  const std::string what = key.empty() ? std::string("the saved object") : cat("entry '", key, "'");
  if (state->kind != Value::Kind::Dict)
    throw Error(cat(where, what, " is ", a_kind(state->kind), ", not a state dict"));

  file->storages = std::make_unique<Storages>(zip, prefix, big_endian, where);
  StoredTensors result;
  for (const auto& [k, v] : state->pairs) {
    if (k->kind != Value::Kind::String) throw Error(cat(where, what, " has ", a_kind(k->kind), " key, not a name"));
    if (v->kind != Value::Kind::Tensor) {
      if (key.empty())
        throw Error(cat(where, "entry '", k->text, "' is ", a_kind(v->kind),
                        ", not a tensor: the file holds a dict beside its state dict (keys: ", keys_of(*state),
                        "); name the entry holding the state dict with --weights-key"));
      throw Error(cat(where, what, ": '", k->text, "' is ", a_kind(v->kind), ", not a tensor"));
    }
    if (result.count(k->text)) throw Error(cat(where, what, " names tensor '", k->text, "' twice"));
    file->storages->check(k->text, *v);
    const Value* tensor = v;
    result.emplace(k->text, StoredTensor{v->size, v->storage->dtype, [file, name = k->text, tensor](float* out) {
                                           file->storages->read_into(name, *tensor, out);
                                         }});
  }
  return result;
}

SafetensorsFile read_torch_state_dict(const std::string& path, const std::string& key) {
  SafetensorsFile result;
  for (const auto& [name, stored] : open_torch_state_dict(path, key)) {
    Tensor values = Tensor::empty(stored.shape);
    stored.read_into(values.data());
    result.tensors.emplace(name, values);
    result.dtypes.emplace(name, stored.dtype);
  }
  return result;
}

}  // namespace adjoint
