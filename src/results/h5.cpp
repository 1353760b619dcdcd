// Implementation of the checked RAII layer over HDF5 (see h5.h for the storage conventions).
#include "results/h5.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <type_traits>

namespace ppb::h5 {
namespace {

// ---- errors -------------------------------------------------------------------------------

// "rank R, host H": the rank from the launcher's environment (this layer has no MPI).
std::string where_am_i() {
  char host[256] = "?";
  if (gethostname(host, sizeof host) != 0) std::strcpy(host, "?");
  host[sizeof host - 1] = '\0';
  std::string rank = "?";
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var)) {
      rank = v;
      break;
    }
  }
  return "rank " + rank + ", host " + host;
}

struct StackSummary {
  std::string top;    // the API call that failed, e.g. "H5Fopen(): unable to open file"
  std::string cause;  // the innermost entry, usually the reason
  int depth = 0;
};

herr_t summarize_entry(unsigned n, const H5E_error2_t* err, void* data) {
  auto* s = static_cast<StackSummary*>(data);
  try {
    std::string desc = err->desc ? err->desc : "";
    char minor[256] = "";
    H5Eget_msg(err->min_num, nullptr, minor, sizeof minor);  // best effort, unchecked
    if (n == 0) s->top = std::string(err->func_name ? err->func_name : "?") + "(): " + desc;
    s->cause = desc + (minor[0] != '\0' ? std::string(" [") + minor + "]" : std::string());
    ++s->depth;
  } catch (...) {
    return -1;
  }
  return 0;
}

// The top and innermost messages of the current HDF5 error stack. Works on a copy, because
// most HDF5 API calls clear the default stack when they start. Unchecked on purpose: it runs
// while an error is being reported.
std::string error_stack_message() {
  hid_t stack = H5Eget_current_stack();
  if (stack < 0) return "(HDF5 error stack unavailable)";
  StackSummary s;
  H5Ewalk2(stack, H5E_WALK_DOWNWARD, summarize_entry, &s);
  H5Eclose_stack(stack);
  if (s.depth == 0) return "(empty HDF5 error stack)";
  if (s.depth == 1) return s.top;
  return s.top + " (cause: " + s.cause + ")";
}

[[noreturn]] void throw_call_error(const char* call, const char* file, int line) {
  std::string stack = error_stack_message();  // first: nothing else may touch the stack
  std::string path = file;
  if (auto pos = path.rfind("src/"); pos != std::string::npos) path = path.substr(pos);
  throw InternalError(std::string("HDF5 call failed: ") + call + " at " + path + ":" +
                      std::to_string(line) + " (" + where_am_i() + "): " + stack);
}

// HDF5 reports failure with a negative value (hid_t, herr_t, htri_t, ssize_t, the enums'
// *_ERROR = -1) or, for functions returning a size_t, with 0.
template <class T>
T check(T value, const char* call, const char* file, int line) {
  bool failed;
  if constexpr (std::is_unsigned_v<T>)
    failed = value == 0;
  else
    failed = value < 0;
  if (failed) throw_call_error(call, file, line);
  return value;
}

// The one macro through which every HDF5 call of this layer goes: returns the call's value,
// or throws InternalError naming the call, file:line, rank/host and the HDF5 error stack.
#define H5_CHECK(call) check((call), #call, __FILE__, __LINE__)

// Turns off HDF5's printing of every error stack to stderr (we report errors ourselves).
void ensure_library() {
  static const bool done = [] {
    H5_CHECK(H5open());
    H5_CHECK(H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr));
    return true;
  }();
  (void)done;
}

// Also at load time, so that even a failure before the first File (an empty handle) is not
// printed to stderr.
[[maybe_unused]] const bool kLibraryReady = (ensure_library(), true);

herr_t close_id(hid_t id) {
  switch (H5Iget_type(id)) {
    case H5I_FILE: return H5Fclose(id);
    case H5I_GROUP: return H5Gclose(id);
    case H5I_DATASET: return H5Dclose(id);
    case H5I_ATTR: return H5Aclose(id);
    case H5I_DATATYPE: return H5Tclose(id);
    case H5I_DATASPACE: return H5Sclose(id);
    case H5I_GENPROP_LST: return H5Pclose(id);
    case H5I_ERROR_STACK: return H5Eclose_stack(id);
    default: return H5Idec_ref(id) < 0 ? -1 : 0;
  }
}

// ---- names --------------------------------------------------------------------------------

std::string object_path(hid_t id) {
  ssize_t n = H5_CHECK(H5Iget_name(id, nullptr, 0));
  if (n == 0) return "(anonymous)";
  std::string s(static_cast<std::size_t>(n) + 1, '\0');
  H5_CHECK(H5Iget_name(id, s.data(), s.size()));
  s.resize(static_cast<std::size_t>(n));
  return s;
}

std::string file_name(hid_t id) {
  ssize_t n = H5_CHECK(H5Fget_name(id, nullptr, 0));
  std::string s(static_cast<std::size_t>(n) + 1, '\0');
  H5_CHECK(H5Fget_name(id, s.data(), s.size()));
  s.resize(static_cast<std::size_t>(n));
  return s;
}

// "'/a/b' in 'run.h5'", for messages.
std::string describe(hid_t id) {
  return "'" + object_path(id) + "' in '" + file_name(id) + "'";
}

// ---- types and spaces ---------------------------------------------------------------------

template <class T>
hid_t native_type() {
  if constexpr (std::is_same_v<T, double>) return H5T_NATIVE_DOUBLE;
  else if constexpr (std::is_same_v<T, float>) return H5T_NATIVE_FLOAT;
  else if constexpr (std::is_same_v<T, std::int8_t>) return H5T_NATIVE_INT8;
  else if constexpr (std::is_same_v<T, std::int32_t>) return H5T_NATIVE_INT32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return H5T_NATIVE_INT64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return H5T_NATIVE_UINT8;
  else static_assert(sizeof(T) == 0, "no HDF5 type for T");
}

// The type in the file: fixed little-endian, whatever the machine.
template <class T>
hid_t file_type() {
  if constexpr (std::is_same_v<T, double>) return H5T_IEEE_F64LE;
  else if constexpr (std::is_same_v<T, float>) return H5T_IEEE_F32LE;
  else if constexpr (std::is_same_v<T, std::int8_t>) return H5T_STD_I8LE;
  else if constexpr (std::is_same_v<T, std::int32_t>) return H5T_STD_I32LE;
  else if constexpr (std::is_same_v<T, std::int64_t>) return H5T_STD_I64LE;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return H5T_STD_U8LE;
  else static_assert(sizeof(T) == 0, "no HDF5 type for T");
}

// Variable-length UTF-8 string: what h5py writes for `str` and reads back as str/bytes.
Handle vlen_utf8_type() {
  Handle t(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(t.id(), H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(t.id(), H5T_CSET_UTF8));
  return t;
}

Handle scalar_space() { return Handle(H5_CHECK(H5Screate(H5S_SCALAR))); }

Handle simple_space(const std::vector<hsize_t>& dims) {
  if (dims.empty()) return scalar_space();
  return Handle(H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
}

std::vector<const char*> c_strings(const std::vector<std::string>& v) {
  std::vector<const char*> ptrs;
  ptrs.reserve(v.size());
  for (const auto& s : v) ptrs.push_back(s.c_str());
  return ptrs;
}

// ---- reading (shared by attributes and datasets) ------------------------------------------

// An open attribute or dataset to read from.
struct Source {
  hid_t id;
  bool is_attr;
  std::string name;  // the attribute's name (for messages); unused for datasets
  hid_t owner;       // the object carrying the attribute (for messages)

  Handle type() const {
    return Handle(is_attr ? H5_CHECK(H5Aget_type(id)) : H5_CHECK(H5Dget_type(id)));
  }
  Handle space() const {
    return Handle(is_attr ? H5_CHECK(H5Aget_space(id)) : H5_CHECK(H5Dget_space(id)));
  }
  std::size_t count() const {
    Handle s = space();
    return static_cast<std::size_t>(H5_CHECK(H5Sget_simple_extent_npoints(s.id())));
  }
  void read(hid_t mem_type, void* buf) const {
    if (is_attr)
      H5_CHECK(H5Aread(id, mem_type, buf));
    else
      H5_CHECK(H5Dread(id, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf));
  }
  std::string what() const {
    return is_attr ? "attribute '" + name + "' of " + describe(owner) : "dataset " + describe(id);
  }
};

const char* class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "integers";
    case H5T_FLOAT: return "floats";
    case H5T_STRING: return "strings";
    case H5T_ENUM: return "enums";
    case H5T_COMPOUND: return "compound values";
    case H5T_ARRAY: return "arrays";
    case H5T_VLEN: return "variable-length sequences";
    default: return "non-numeric data";
  }
}

template <class T>
std::vector<T> read_numbers(const Source& src) {
  Handle ftype = src.type();
  H5T_class_t cls = H5_CHECK(H5Tget_class(ftype.id()));
  std::size_t n = src.count();
  std::vector<T> out(n);
  if (cls == H5T_INTEGER || cls == H5T_FLOAT) {
    if (n > 0) src.read(native_type<T>(), out.data());  // HDF5 converts (int64 -> double, ...)
    return out;
  }
  if (cls == H5T_ENUM) {
    // h5py stores numpy bools as enum {FALSE = 0, TRUE = 1} over int8. HDF5 does not convert
    // enum -> integer, so read the raw enum values and convert them from the base type.
    Handle native(H5_CHECK(H5Tget_native_type(ftype.id(), H5T_DIR_ASCEND)));
    Handle base(H5_CHECK(H5Tget_super(native.id())));
    H5T_class_t base_cls = H5_CHECK(H5Tget_class(base.id()));
    if (base_cls == H5T_INTEGER) {
      if (n == 0) return out;
      std::size_t width = std::max(H5_CHECK(H5Tget_size(native.id())), sizeof(T));
      std::vector<unsigned char> buf(n * width);
      src.read(native.id(), buf.data());
      H5_CHECK(H5Tconvert(base.id(), native_type<T>(), n, buf.data(), nullptr, H5P_DEFAULT));
      std::memcpy(out.data(), buf.data(), n * sizeof(T));
      return out;
    }
  }
  throw InternalError(src.what() + " holds " + class_name(cls) + ", not numbers");
}

std::vector<std::string> read_strings(const Source& src) {
  Handle ftype = src.type();
  H5T_class_t cls = H5_CHECK(H5Tget_class(ftype.id()));
  if (cls != H5T_STRING)
    throw InternalError(src.what() + " holds " + class_name(cls) + ", not strings");
  std::size_t n = src.count();
  std::vector<std::string> out;
  out.reserve(n);
  if (n == 0) return out;
  H5T_cset_t cset = H5_CHECK(H5Tget_cset(ftype.id()));
  Handle mem(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_cset(mem.id(), cset));
  if (H5_CHECK(H5Tis_variable_str(ftype.id())) > 0) {
    H5_CHECK(H5Tset_size(mem.id(), H5T_VARIABLE));
    std::vector<char*> ptrs(n, nullptr);
    src.read(mem.id(), ptrs.data());
    // HDF5 malloc'ed every string: copy, then give them back (also if copying throws).
    struct Reclaim {
      hid_t mem;
      std::vector<char*>& ptrs;
      ~Reclaim() {
        Handle space(H5Screate_simple(1, std::array<hsize_t, 1>{ptrs.size()}.data(), nullptr));
#if H5_VERSION_GE(1, 12, 0)
        H5Treclaim(mem, space.id(), H5P_DEFAULT, ptrs.data());
#else
        H5Dvlen_reclaim(mem, space.id(), H5P_DEFAULT, ptrs.data());
#endif
      }
    } reclaim{mem.id(), ptrs};
    for (char* p : ptrs) out.emplace_back(p ? p : "");
    return out;
  }
  // Fixed-length (e.g. numpy bytes_ written by h5py): read null-padded, cut at the first NUL.
  std::size_t width = H5_CHECK(H5Tget_size(ftype.id()));
  H5_CHECK(H5Tset_size(mem.id(), width));
  H5_CHECK(H5Tset_strpad(mem.id(), H5T_STR_NULLPAD));
  std::vector<char> buf(n * width);
  src.read(mem.id(), buf.data());
  for (std::size_t i = 0; i < n; ++i) {
    const char* p = buf.data() + i * width;
    out.emplace_back(p, strnlen(p, width));
  }
  return out;
}

template <class T>
T single(std::vector<T> values, const Source& src) {
  if (values.size() != 1)
    throw InternalError(src.what() + " holds " + std::to_string(values.size()) +
                        " values, expected exactly one");
  return std::move(values.front());
}

// ---- attributes ---------------------------------------------------------------------------

void write_attr(hid_t obj, const std::string& name, hid_t ftype, hid_t mtype, hid_t space,
                const void* buf) {
  if (H5_CHECK(H5Aexists(obj, name.c_str())) > 0) {
    // Same type and shape: overwrite in place. Deleting and creating it again would free and
    // allocate space in the file's heaps each time, and a file opened again and again for
    // appends (File::open_rw: elapsed_s after every round) forgets freed space at each close.
    Handle old(H5_CHECK(H5Aopen(obj, name.c_str(), H5P_DEFAULT)));
    Handle old_type(H5_CHECK(H5Aget_type(old.id())));
    Handle old_space(H5_CHECK(H5Aget_space(old.id())));
    if (H5_CHECK(H5Tequal(old_type.id(), ftype)) > 0 &&
        H5_CHECK(H5Sextent_equal(old_space.id(), space)) > 0) {
      const auto n = static_cast<std::size_t>(H5_CHECK(H5Sget_simple_extent_npoints(space)));
      if (n == 0) return;
      // An equal value is not written again: even in place, a write stamps the object's
      // header with a new change time (the 1.8 format keeps times), so a file brought up to
      // date with nothing new would not stay the same to the byte. Strings never get here with
      // an equal value (holds_strings); a variable-length one is written, not compared.
      if (H5_CHECK(H5Tis_variable_str(mtype)) == 0) {
        std::vector<unsigned char> stored(n * H5_CHECK(H5Tget_size(mtype)));
        H5_CHECK(H5Aread(old.id(), mtype, stored.data()));
        if (std::memcmp(stored.data(), buf, stored.size()) == 0) return;
      }
      H5_CHECK(H5Awrite(old.id(), mtype, buf));
      return;
    }
    old.close();
    H5_CHECK(H5Adelete(obj, name.c_str()));
  }
  Handle attr(H5_CHECK(H5Acreate2(obj, name.c_str(), ftype, space, H5P_DEFAULT, H5P_DEFAULT)));
  // An empty array ([0]) has nothing to write (and H5Awrite rejects its null buffer).
  if (H5_CHECK(H5Sget_simple_extent_npoints(space)) > 0)
    H5_CHECK(H5Awrite(attr.id(), mtype, buf));
}

herr_t collect_name(const char* name, void* data) {
  try {
    static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  } catch (...) {
    return -1;  // stop iterating; the caller's H5_CHECK reports it
  }
  return 0;
}

herr_t collect_attr_name(hid_t, const char* name, const H5A_info_t*, void* data) {
  return collect_name(name, data);
}

herr_t collect_link_name(hid_t, const char* name, const H5L_info_t*, void* data) {
  return collect_name(name, data);
}

// ---- datasets -----------------------------------------------------------------------------

// Datasets at most this big stay contiguous: compression would save little and chunk
// bookkeeping costs about as much.
constexpr std::size_t kContiguousMaxBytes = 64 * 1024;
// Chunk size target. 256 KiB fits HDF5's default 1 MiB chunk cache four times over and
// compresses well; a 1 M-event timestamps array [1e6 x 6 doubles] = 48 MB -> ~190 chunks.
constexpr std::size_t kChunkTargetBytes = 256 * 1024;

// Chunk shape: halve the slowest axes first, so that a chunk is a run of whole rows (a
// contiguous slab in C order), which suits writing once and reading everything back.
std::vector<hsize_t> chunk_shape(const std::vector<hsize_t>& dims, std::size_t elem_bytes) {
  std::vector<hsize_t> chunk = dims;
  auto bytes = [&] {
    hsize_t b = elem_bytes;
    for (hsize_t d : chunk) b *= d;
    return b;
  };
  for (std::size_t axis = 0; axis < chunk.size() && bytes() > kChunkTargetBytes;) {
    if (chunk[axis] > 1)
      chunk[axis] = (chunk[axis] + 1) / 2;
    else
      ++axis;
  }
  return chunk;
}

// Extendible datasets (Group::write_extendible) get one row, or a few, per benchmark round,
// appended in a file opened again for each round (File::open_rw). Their chunks are
//   - whole rows, about kAppendChunkBytes of them: the per-round datasets stay in a few chunks
//     (a 1 GB events array in ~16k, a chunk index three levels deep) and each dataset wastes at
//     most one chunk (its last, allocated whole when first written, filled as rounds come);
//   - at most kAppendChunkMaxRows rows: a per-round scalar (8-byte rows) would otherwise be
//     given 8192-row chunks, 64 KiB each for a handful of rounds; 1024 rows (8 KiB) hold a
//     long run's rounds in one or two chunks;
//   - uncompressed while they hold several rows: a compressed chunk that an append fills
//     further is compressed again and, at its new size, stored at a new place in the file;
//     the old place becomes free space that HDF5 forgets when the file is closed, so every
//     round would leak about a chunk. An uncompressed chunk keeps its place, and an append
//     writes the new row's bytes alone;
//   - one row each, compressed (shuffle + gzip 4, as write_dataset), for rows of at least
//     kAppendCompressRowBytes (the events of a longer generation: 99 KB a repetition for
//     M = 8, G = 128, S = 2): every append then writes whole new chunks, each compressed
//     once and never rewritten, and timestamps shrink about twice (real runs' events);
//   - rows over kAppendChunkBytes split along their slowest axes, so that no chunk outgrows
//     HDF5's 1 MiB chunk cache.
constexpr std::size_t kAppendChunkBytes = 64 * 1024;
constexpr hsize_t kAppendChunkMaxRows = 1024;
constexpr std::size_t kAppendCompressRowBytes = 16 * 1024;

// The chunk shape of an extendible dataset of `dims` (see above); `compress`: whether its
// chunks are one row each, to be compressed.
std::vector<hsize_t> append_chunk_shape(const std::vector<hsize_t>& dims, std::size_t elem_bytes,
                                        bool* compress) {
  std::vector<hsize_t> chunk = dims;
  hsize_t row_bytes = elem_bytes;
  for (std::size_t axis = 1; axis < dims.size(); ++axis) row_bytes *= dims[axis];
  *compress = row_bytes >= kAppendCompressRowBytes;
  chunk[0] =
      *compress ? 1 : std::clamp<hsize_t>(kAppendChunkBytes / row_bytes, 1, kAppendChunkMaxRows);
  auto bytes = [&] {
    hsize_t b = elem_bytes;
    for (hsize_t d : chunk) b *= d;
    return b;
  };
  for (std::size_t axis = 1; axis < chunk.size() && bytes() > kAppendChunkBytes;) {
    if (chunk[axis] > 1)
      chunk[axis] = (chunk[axis] + 1) / 2;
    else
      ++axis;
  }
  return chunk;
}

// Shuffle + gzip level 4 on the chunks of `dcpl`. Shuffle groups the bytes of equal
// significance together, so that gzip finds the repeated high bytes of timestamps and small
// integers.
void set_compression(hid_t dcpl) {
  H5_CHECK(H5Pset_shuffle(dcpl));
  if (H5_CHECK(H5Zfilter_avail(H5Z_FILTER_DEFLATE)) > 0) H5_CHECK(H5Pset_deflate(dcpl, 4));
}

std::string dims_text(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

// ---- Handle -------------------------------------------------------------------------------

void Handle::reset() noexcept {
  if (valid()) close_id(release());  // a destructor must not throw: failure is ignored
}

void Handle::close() {
  if (valid()) H5_CHECK(close_id(release()));
}

// ---- Object -------------------------------------------------------------------------------

std::string Object::path() const { return object_path(id()); }

void Object::set_attr(const std::string& name, bool value) {
  std::int8_t v = value ? 1 : 0;
  write_attr(id(), name, file_type<std::int8_t>(), native_type<std::int8_t>(),
             scalar_space().id(), &v);
}

void Object::set_int64_attr(const std::string& name, std::int64_t value) {
  write_attr(id(), name, file_type<std::int64_t>(), native_type<std::int64_t>(),
             scalar_space().id(), &value);
}

void Object::set_attr(const std::string& name, double value) {
  write_attr(id(), name, file_type<double>(), native_type<double>(), scalar_space().id(),
             &value);
}

namespace {

// True when attribute `name` of `obj` holds exactly `value`: strings, as a scalar (`scalar`)
// or a 1-D array. Writing a variable-length string, even in place, puts it in a new global
// heap collection (4 KiB) at each opening of the file, so a file opened for every round
// (File::open_rw) would grow by 4 KiB a round for an unchanged `status`: the setters below
// do not write an equal value again.
bool holds_strings(const Object& obj, const std::string& name,
                   const std::vector<std::string>& value, bool scalar) {
  if (!obj.has_attr(name)) return false;
  Handle attr(H5_CHECK(H5Aopen(obj.id(), name.c_str(), H5P_DEFAULT)));
  Source src{attr.id(), true, name, obj.id()};
  Handle type = src.type();
  Handle space = src.space();
  if (H5_CHECK(H5Tget_class(type.id())) != H5T_STRING ||
      (H5_CHECK(H5Sget_simple_extent_type(space.id())) == H5S_SCALAR) != scalar)
    return false;
  return read_strings(src) == value;
}

}  // namespace

void Object::set_attr(const std::string& name, const std::string& value) {
  if (holds_strings(*this, name, {value}, true)) return;
  Handle type = vlen_utf8_type();
  const char* p = value.c_str();
  write_attr(id(), name, type.id(), type.id(), scalar_space().id(), &p);
}

void Object::set_attr(const std::string& name, const char* value) {
  set_attr(name, std::string(value));
}

void Object::set_attr(const std::string& name, const std::vector<double>& value) {
  write_attr(id(), name, file_type<double>(), native_type<double>(),
             simple_space({value.size()}).id(), value.data());
}

void Object::set_attr(const std::string& name, const std::vector<std::int64_t>& value) {
  write_attr(id(), name, file_type<std::int64_t>(), native_type<std::int64_t>(),
             simple_space({value.size()}).id(), value.data());
}

void Object::set_attr(const std::string& name, const std::vector<std::string>& value) {
  if (holds_strings(*this, name, value, false)) return;
  Handle type = vlen_utf8_type();
  std::vector<const char*> ptrs = c_strings(value);
  write_attr(id(), name, type.id(), type.id(), simple_space({value.size()}).id(), ptrs.data());
}

bool Object::has_attr(const std::string& name) const {
  return H5_CHECK(H5Aexists(id(), name.c_str())) > 0;
}

std::vector<std::string> Object::attr_names() const {
  std::vector<std::string> names;
  H5_CHECK(H5Aiterate2(id(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attr_name, &names));
  return names;
}

void Object::delete_attr(const std::string& name) {
  if (!has_attr(name)) throw InternalError("no attribute '" + name + "' on " + describe(id()));
  H5_CHECK(H5Adelete(id(), name.c_str()));
}

template <AttrValue T>
T Object::get_attr(const std::string& name) const {
  if (!has_attr(name)) throw InternalError("no attribute '" + name + "' on " + describe(id()));
  Handle attr(H5_CHECK(H5Aopen(id(), name.c_str(), H5P_DEFAULT)));
  Source src{attr.id(), true, name, id()};
  if constexpr (std::is_same_v<T, std::string>) {
    return single(read_strings(src), src);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return read_strings(src);
  } else if constexpr (std::is_same_v<T, std::vector<double>>) {
    return read_numbers<double>(src);
  } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
    return read_numbers<std::int64_t>(src);
  } else if constexpr (std::is_same_v<T, bool>) {
    return single(read_numbers<std::int64_t>(src), src) != 0;
  } else if constexpr (std::is_same_v<T, int>) {
    std::int64_t v = single(read_numbers<std::int64_t>(src), src);
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
      throw InternalError(src.what() + " = " + std::to_string(v) + " does not fit in int");
    return static_cast<int>(v);
  } else {
    return single(read_numbers<T>(src), src);
  }
}

template std::int64_t Object::get_attr<std::int64_t>(const std::string&) const;
template int Object::get_attr<int>(const std::string&) const;
template double Object::get_attr<double>(const std::string&) const;
template bool Object::get_attr<bool>(const std::string&) const;
template std::string Object::get_attr<std::string>(const std::string&) const;
template std::vector<double> Object::get_attr<std::vector<double>>(const std::string&) const;
template std::vector<std::int64_t> Object::get_attr<std::vector<std::int64_t>>(
    const std::string&) const;
template std::vector<std::string> Object::get_attr<std::vector<std::string>>(
    const std::string&) const;

// ---- Dataset ------------------------------------------------------------------------------

std::vector<hsize_t> Dataset::dims() const {
  Handle space(H5_CHECK(H5Dget_space(id())));
  int rank = H5_CHECK(H5Sget_simple_extent_ndims(space.id()));
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0) H5_CHECK(H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr));
  return dims;
}

std::size_t Dataset::size() const { return Source{id(), false, {}, id()}.count(); }

bool Dataset::extendible() const {
  Handle space(H5_CHECK(H5Dget_space(id())));
  int rank = H5_CHECK(H5Sget_simple_extent_ndims(space.id()));
  if (rank < 1) return false;
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), maxdims(dims.size());
  H5_CHECK(H5Sget_simple_extent_dims(space.id(), dims.data(), maxdims.data()));
  return maxdims[0] == H5S_UNLIMITED;
}

template <DatasetElement T>
void Dataset::append(const T* data, std::size_t count) {
  if (!extendible())
    throw InternalError("cannot append rows to dataset " + describe(id()) +
                        ": its first axis is fixed (not written by write_extendible)");
  std::vector<hsize_t> old_dims = dims();
  hsize_t row = 1;
  for (std::size_t axis = 1; axis < old_dims.size(); ++axis) row *= old_dims[axis];
  if (row == 0 || count % row != 0)
    throw InternalError("cannot append " + std::to_string(count) + " values to dataset " +
                        describe(id()) + " of dims " + dims_text(old_dims) +
                        ": not a whole number of rows");
  if (count == 0) return;
  std::vector<hsize_t> new_dims = old_dims, start(old_dims.size(), 0), rows = old_dims;
  new_dims[0] += count / row;
  start[0] = old_dims[0];
  rows[0] = count / row;
  H5_CHECK(H5Dset_extent(id(), new_dims.data()));
  // The file space after the extent grew: only the new rows are selected and written.
  Handle file_space(H5_CHECK(H5Dget_space(id())));
  H5_CHECK(H5Sselect_hyperslab(file_space.id(), H5S_SELECT_SET, start.data(), nullptr,
                               rows.data(), nullptr));
  Handle mem_space = simple_space(rows);
  H5_CHECK(H5Dwrite(id(), native_type<T>(), mem_space.id(), file_space.id(), H5P_DEFAULT, data));
}

template void Dataset::append<double>(const double*, std::size_t);
template void Dataset::append<float>(const float*, std::size_t);
template void Dataset::append<std::int32_t>(const std::int32_t*, std::size_t);
template void Dataset::append<std::int64_t>(const std::int64_t*, std::size_t);
template void Dataset::append<std::uint8_t>(const std::uint8_t*, std::size_t);

template <DatasetElement T>
std::vector<T> Dataset::read() const {
  return read_numbers<T>(Source{id(), false, {}, id()});
}

template std::vector<double> Dataset::read<double>() const;
template std::vector<float> Dataset::read<float>() const;
template std::vector<std::int32_t> Dataset::read<std::int32_t>() const;
template std::vector<std::int64_t> Dataset::read<std::int64_t>() const;
template std::vector<std::uint8_t> Dataset::read<std::uint8_t>() const;

std::vector<std::string> Dataset::read_strings() const {
  return h5::read_strings(Source{id(), false, {}, id()});
}

std::string Dataset::read_string() const {
  Source src{id(), false, {}, id()};
  return single(h5::read_strings(src), src);
}

// ---- Group --------------------------------------------------------------------------------

bool Group::exists(const std::string& name) const {
  // H5Lexists fails (rather than answering false) when an intermediate group of "a/b/c" is
  // missing, so check each prefix in turn, and that each intermediate is a group.
  std::string prefix = name.starts_with('/') ? "/" : "";
  std::size_t start = prefix.size();
  bool any = false;
  while (start <= name.size()) {
    std::size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    if (end > start) {
      if (any) {
        Handle obj(H5_CHECK(H5Oopen(id(), prefix.c_str(), H5P_DEFAULT)));
        if (H5_CHECK(H5Iget_type(obj.id())) != H5I_GROUP) return false;
      }
      if (!prefix.empty() && prefix.back() != '/') prefix += '/';
      prefix.append(name, start, end - start);
      if (H5_CHECK(H5Lexists(id(), prefix.c_str(), H5P_DEFAULT)) <= 0) return false;
      any = true;
    }
    start = end + 1;
  }
  return any || prefix == "/";
}

bool Group::is_group(const std::string& name) const {
  if (!exists(name)) return false;
  Handle obj(H5_CHECK(H5Oopen(id(), name.c_str(), H5P_DEFAULT)));
  return H5_CHECK(H5Iget_type(obj.id())) == H5I_GROUP;
}

Group Group::create_group(const std::string& name) {
  if (exists(name))
    throw InternalError("cannot create group '" + name + "' in " + describe(id()) +
                        ": it exists already");
  Handle lcpl(H5_CHECK(H5Pcreate(H5P_LINK_CREATE)));
  H5_CHECK(H5Pset_create_intermediate_group(lcpl.id(), 1));
  return Group(
      Handle(H5_CHECK(H5Gcreate2(id(), name.c_str(), lcpl.id(), H5P_DEFAULT, H5P_DEFAULT))));
}

Group Group::require_group(const std::string& name) {
  return exists(name) ? open_group(name) : create_group(name);
}

Group Group::open_group(const std::string& name) const {
  if (!is_group(name))
    throw InternalError((exists(name) ? "'" + name + "' is not a group in "
                                      : "no group '" + name + "' in ") +
                        describe(id()));
  return Group(Handle(H5_CHECK(H5Gopen2(id(), name.c_str(), H5P_DEFAULT))));
}

std::vector<std::string> Group::children() const {
  std::vector<std::string> names;
  H5_CHECK(H5Literate(id(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_link_name, &names));
  return names;
}

Dataset Group::open_dataset(const std::string& name) const {
  if (!exists(name)) throw InternalError("no dataset '" + name + "' in " + describe(id()));
  Handle obj(H5_CHECK(H5Oopen(id(), name.c_str(), H5P_DEFAULT)));
  if (H5_CHECK(H5Iget_type(obj.id())) != H5I_DATASET)
    throw InternalError("'" + name + "' is not a dataset in " + describe(id()));
  return Dataset(std::move(obj));
}

Dataset Group::create_dataset(const std::string& name, hid_t ftype, hid_t mtype,
                              const std::vector<hsize_t>& dims, std::size_t count,
                              const void* data, Storage storage) {
  hsize_t expected = 1;
  for (hsize_t d : dims) expected *= d;
  if (expected != count)
    throw InternalError("dataset '" + name + "' in " + describe(id()) + ": " +
                        std::to_string(count) + " values for dims " + dims_text(dims) +
                        " (which hold " + std::to_string(expected) + ")");
  if (exists(name))
    throw InternalError("cannot create dataset '" + name + "' in " + describe(id()) +
                        ": it exists already");
  std::size_t elem = H5_CHECK(H5Tget_size(ftype));
  Handle space;
  Handle dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  if (storage == Storage::extendible) {
    if (dims.empty() || std::find(dims.begin() + 1, dims.end(), hsize_t{0}) != dims.end())
      throw InternalError("extendible dataset '" + name + "' in " + describe(id()) + ": dims " +
                          dims_text(dims) + " need a first axis and no trailing axis of 0");
    std::vector<hsize_t> maxdims = dims;
    maxdims[0] = H5S_UNLIMITED;
    space = Handle(H5_CHECK(
        H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data())));
    bool compress = false;
    std::vector<hsize_t> chunk = append_chunk_shape(dims, elem, &compress);
    H5_CHECK(H5Pset_chunk(dcpl.id(), static_cast<int>(chunk.size()), chunk.data()));
    if (compress) set_compression(dcpl.id());
  } else {
    space = simple_space(dims);
  }
  Handle lcpl(H5_CHECK(H5Pcreate(H5P_LINK_CREATE)));
  H5_CHECK(H5Pset_create_intermediate_group(lcpl.id(), 1));
  if (storage == Storage::compressible && !dims.empty() && count * elem > kContiguousMaxBytes) {
    std::vector<hsize_t> chunk = chunk_shape(dims, elem);
    H5_CHECK(H5Pset_chunk(dcpl.id(), static_cast<int>(chunk.size()), chunk.data()));
    set_compression(dcpl.id());
  }
  Handle ds(H5_CHECK(
      H5Dcreate2(id(), name.c_str(), ftype, space.id(), lcpl.id(), dcpl.id(), H5P_DEFAULT)));
  if (count > 0) H5_CHECK(H5Dwrite(ds.id(), mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
  return Dataset(std::move(ds));
}

template <DatasetElement T>
Dataset Group::write_dataset(const std::string& name, const std::vector<T>& data,
                             const std::vector<hsize_t>& dims) {
  return create_dataset(name, file_type<T>(), native_type<T>(), dims, data.size(), data.data(),
                        Storage::compressible);
}

template <DatasetElement T>
Dataset Group::write_extendible(const std::string& name, const std::vector<T>& data,
                                const std::vector<hsize_t>& dims) {
  return create_dataset(name, file_type<T>(), native_type<T>(), dims, data.size(), data.data(),
                        Storage::extendible);
}

template Dataset Group::write_extendible<double>(const std::string&, const std::vector<double>&,
                                                 const std::vector<hsize_t>&);
template Dataset Group::write_extendible<float>(const std::string&, const std::vector<float>&,
                                                const std::vector<hsize_t>&);
template Dataset Group::write_extendible<std::int32_t>(const std::string&,
                                                       const std::vector<std::int32_t>&,
                                                       const std::vector<hsize_t>&);
template Dataset Group::write_extendible<std::int64_t>(const std::string&,
                                                       const std::vector<std::int64_t>&,
                                                       const std::vector<hsize_t>&);
template Dataset Group::write_extendible<std::uint8_t>(const std::string&,
                                                       const std::vector<std::uint8_t>&,
                                                       const std::vector<hsize_t>&);

template Dataset Group::write_dataset<double>(const std::string&, const std::vector<double>&,
                                              const std::vector<hsize_t>&);
template Dataset Group::write_dataset<float>(const std::string&, const std::vector<float>&,
                                             const std::vector<hsize_t>&);
template Dataset Group::write_dataset<std::int32_t>(const std::string&,
                                                    const std::vector<std::int32_t>&,
                                                    const std::vector<hsize_t>&);
template Dataset Group::write_dataset<std::int64_t>(const std::string&,
                                                    const std::vector<std::int64_t>&,
                                                    const std::vector<hsize_t>&);
template Dataset Group::write_dataset<std::uint8_t>(const std::string&,
                                                    const std::vector<std::uint8_t>&,
                                                    const std::vector<hsize_t>&);

Dataset Group::write_strings(const std::string& name, const std::vector<std::string>& data) {
  // Contiguous: a variable-length string's bytes live in the global heap, so compressing
  // the dataset would only compress the 16-byte heap references.
  Handle type = vlen_utf8_type();
  std::vector<const char*> ptrs = c_strings(data);
  return create_dataset(name, type.id(), type.id(), {static_cast<hsize_t>(data.size())},
                        data.size(), ptrs.data(), Storage::fixed);
}

Dataset Group::write_string(const std::string& name, const std::string& text) {
  Handle type = vlen_utf8_type();
  const char* p = text.c_str();
  return create_dataset(name, type.id(), type.id(), {}, 1, &p, Storage::fixed);
}

// ---- File ---------------------------------------------------------------------------------

File File::create(const std::string& path) {
  ensure_library();
  Handle fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));  // default sec2 driver: serial I/O
  // The 1.8 object format: readable by HDF5 >= 1.8 (all h5py), and it stores attributes over
  // 64 KiB in dense storage where the 1.6 format (HDF5's default) cannot store them at all.
  H5_CHECK(H5Pset_libver_bounds(fapl.id(), H5F_LIBVER_V18, H5F_LIBVER_LATEST));
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id());
  if (id < 0)
    throw UserError("cannot create results file '" + path +
                    "' (does its directory exist, and is it writable?): " +
                    error_stack_message());
  return File(Handle(id), path);
}

namespace {

// The checks File::open and File::open_rw share: `path` exists, is no directory, is HDF5.
void check_openable(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw UserError("cannot open results file '" + path + "': it does not exist");
  if (std::filesystem::is_directory(path, ec))
    throw UserError("cannot open results file '" + path + "': it is a directory");
#if H5_VERSION_GE(1, 12, 0)
  htri_t is_hdf5 = H5Fis_accessible(path.c_str(), H5P_DEFAULT);
#else
  htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
#endif
  if (is_hdf5 < 0)
    throw UserError("cannot open results file '" + path + "': " + error_stack_message());
  if (is_hdf5 == 0)
    throw UserError("cannot open results file '" + path + "': it is not an HDF5 file");
}

}  // namespace

File File::open(const std::string& path) {
  ensure_library();
  check_openable(path);
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0)
    throw UserError("cannot open results file '" + path + "': " + error_stack_message());
  return File(Handle(id), path);
}

File File::open_rw(const std::string& path) {
  ensure_library();
  check_openable(path);
  Handle fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  // As create(): the objects this opening creates use the 1.8 object format too.
  H5_CHECK(H5Pset_libver_bounds(fapl.id(), H5F_LIBVER_V18, H5F_LIBVER_LATEST));
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl.id());
  if (id < 0)
    throw UserError("cannot open results file '" + path +
                    "' for writing (is it writable, and not open in another process, e.g. an "
                    "h5py session? HDF5 locks an open file): " +
                    error_stack_message());
  return File(Handle(id), path);
}

Group File::root() const { return Group(Handle(H5_CHECK(H5Gopen2(id(), "/", H5P_DEFAULT)))); }

void File::flush() { H5_CHECK(H5Fflush(id(), H5F_SCOPE_LOCAL)); }

void File::close() { handle_.close(); }

}  // namespace ppb::h5
