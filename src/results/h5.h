// A thin, checked RAII layer over the HDF5 C API (in the manner of HighFive): move-only handles
// that own one hid_t each, every C call checked once (H5_CHECK in h5.cpp) and turned into
// ppb::InternalError, and typed helpers for the few things a results file needs (DESIGN.md §4).
//
// Conventions (chosen so that h5py reads what we write and we read what h5py writes):
//   - strings (attributes and datasets) are variable-length UTF-8; h5py reads string attributes
//     as `str` and string datasets as `bytes` (`ds.asstr()[...]` gives `str`). Reading accepts
//     variable- and fixed-length strings.
//   - integers are stored as little-endian int64 whatever the C++ integer type (as h5py stores a
//     Python int); bool is stored as int8 0/1 (h5py reads numpy.int8). Reading a bool accepts any
//     integer (non-zero is true) and h5py's own bool (an enum over int8).
//   - doubles are IEEE little-endian float64; datasets keep their element type (float32, ...).
//   - files use the HDF5 1.8 object format (readable by HDF5 >= 1.8 and every h5py), which also
//     allows attributes over 64 KiB.
//
// Serial only: files are opened with the default (sec2) driver from one rank, never MPI-IO.
// The HDF5 library of Debian is not built thread-safe: call this layer from one thread.
#pragma once

#include <hdf5.h>

#include <concepts>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/error.h"

namespace ppb::h5 {

/// Element types that datasets can be written from and read into.
template <class T>
concept DatasetElement = std::same_as<T, double> || std::same_as<T, float> ||
                         std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t> ||
                         std::same_as<T, std::uint8_t>;

/// Types that get_attr<T> can return.
template <class T>
concept AttrValue = std::same_as<T, std::int64_t> || std::same_as<T, int> ||
                    std::same_as<T, double> || std::same_as<T, bool> ||
                    std::same_as<T, std::string> || std::same_as<T, std::vector<double>> ||
                    std::same_as<T, std::vector<std::int64_t>> ||
                    std::same_as<T, std::vector<std::string>>;

/// Integer types accepted by set_attr (all stored as int64).
template <class T>
concept AttrInteger = std::integral<T> && !std::same_as<T, bool>;

/// Owns one HDF5 identifier (file, group, dataset, attribute, datatype, dataspace or property
/// list) and closes it with the matching H5?close on destruction. Move-only; a moved-from
/// Handle holds H5I_INVALID_HID and closes nothing.
class Handle {
 public:
  Handle() noexcept = default;
  /// Takes ownership of `id` (which must be a valid, non-predefined identifier).
  explicit Handle(hid_t id) noexcept : id_(id) {}
  ~Handle() { reset(); }
  Handle(Handle&& other) noexcept : id_(other.release()) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = other.release();
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  /// The identifier, or H5I_INVALID_HID when empty.
  hid_t id() const noexcept { return id_; }
  bool valid() const noexcept { return id_ >= 0; }
  /// Gives up ownership without closing; returns the identifier.
  hid_t release() noexcept {
    hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
  /// Closes the identifier (if any) and ignores a failure: used by the destructor.
  void reset() noexcept;
  /// Closes the identifier (if any). Throws InternalError when HDF5 reports a failure.
  void close();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

/// An HDF5 object that carries attributes: the common base of Group and Dataset.
/// Setting an attribute that exists replaces it (whatever its old type and shape): in place
/// when the new value has the old one's type and shape, so that updating a number in a file
/// opened again and again (File::open_rw) allocates nothing in the file; a string (or string
/// array) equal to the one stored is not written again (a string written costs a new 4 KiB
/// heap block at each opening of the file, h5.cpp).
class Object {
 public:
  /// The underlying identifier (for direct C API calls, e.g. in tests).
  hid_t id() const noexcept { return handle_.id(); }
  bool valid() const noexcept { return handle_.valid(); }
  /// The object's absolute path in its file, e.g. "/benchmark/gpipe".
  std::string path() const;

  /// Stores `value` as an int8 scalar 0/1 (h5py reads numpy.int8).
  void set_attr(const std::string& name, bool value);
  /// Stores any integer as an int64 scalar. Throws InternalError for an unsigned value over
  /// INT64_MAX.
  template <AttrInteger T>
  void set_attr(const std::string& name, T value) {
    set_int64_attr(name, checked_int64(value, name));
  }
  /// Stores a float64 scalar.
  void set_attr(const std::string& name, double value);
  /// Stores a variable-length UTF-8 string scalar.
  void set_attr(const std::string& name, const std::string& value);
  /// Same as the std::string overload (without it a literal would convert to bool).
  void set_attr(const std::string& name, const char* value);
  /// Stores a 1-D float64 array ([n]; n may be 0).
  void set_attr(const std::string& name, const std::vector<double>& value);
  /// Stores a 1-D int64 array ([n]; n may be 0).
  void set_attr(const std::string& name, const std::vector<std::int64_t>& value);
  /// Stores a 1-D int64 array from any other integer type (range-checked as above).
  template <AttrInteger T>
    requires(!std::same_as<T, std::int64_t>)
  void set_attr(const std::string& name, const std::vector<T>& value) {
    std::vector<std::int64_t> wide;
    wide.reserve(value.size());
    for (T v : value) wide.push_back(checked_int64(v, name));
    set_attr(name, wide);
  }
  /// Stores a 1-D array of variable-length UTF-8 strings ([n]; n may be 0).
  void set_attr(const std::string& name, const std::vector<std::string>& value);

  /// Reads attribute `name` as T, converting numbers as HDF5 does (e.g. int64 -> double).
  /// A scalar T needs an attribute holding exactly one value; a vector T reads all values
  /// flattened. Throws InternalError when the attribute is missing, holds the wrong kind of
  /// data (string vs number) or count, or (for int) a value out of range.
  template <AttrValue T>
  T get_attr(const std::string& name) const;
  /// True when attribute `name` exists.
  bool has_attr(const std::string& name) const;
  /// The names of all attributes, sorted by name.
  std::vector<std::string> attr_names() const;
  /// Removes attribute `name`; throws InternalError when it does not exist.
  void delete_attr(const std::string& name);

 protected:
  Object() = default;
  explicit Object(Handle handle) noexcept : handle_(std::move(handle)) {}

 private:
  void set_int64_attr(const std::string& name, std::int64_t value);
  template <AttrInteger T>
  static std::int64_t checked_int64(T value, const std::string& name) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(std::int64_t)) {
      if (value > static_cast<T>(std::numeric_limits<std::int64_t>::max()))
        throw InternalError("attribute '" + name + "': value " + std::to_string(value) +
                            " does not fit in int64");
    }
    return static_cast<std::int64_t>(value);
  }

  Handle handle_;
};

/// An open HDF5 dataset (an n-D array, or a scalar when dims() is empty).
class Dataset : public Object {
 public:
  /// An empty handle; every operation on it throws InternalError.
  Dataset() = default;

  /// The shape, slowest axis first; empty for a scalar.
  std::vector<hsize_t> dims() const;
  /// True when the first axis may grow (a dataset made by Group::write_extendible).
  bool extendible() const;
  /// Appends whole rows after the last one: `count` elements of `data` (C order), a multiple of
  /// the row size (the product of dims()[1:]), written into the rows the first axis grows by
  /// (H5Dset_extent, then a hyperslab write of those rows alone: the cost is that of the new
  /// rows, whatever the dataset holds). count 0 is a no-op. Throws InternalError when the
  /// dataset is not extendible or count is not whole rows.
  template <DatasetElement T>
  void append(const T* data, std::size_t count);
  /// Appends every element of `data` as whole rows (see append(const T*, std::size_t)).
  template <DatasetElement T>
  void append(const std::vector<T>& data) {
    append(data.data(), data.size());
  }
  /// Number of elements (product of dims(); 1 for a scalar).
  std::size_t size() const;
  /// Reads every element, flattened in C (row-major) order, converting as HDF5 does (e.g.
  /// float32 storage read as double). Throws InternalError when the dataset holds strings.
  template <DatasetElement T>
  std::vector<T> read() const;
  /// Reads a dataset of strings (variable- or fixed-length), flattened. Throws InternalError
  /// when it holds numbers.
  std::vector<std::string> read_strings() const;
  /// Reads a dataset holding exactly one string (e.g. written by Group::write_string).
  std::string read_string() const;

 private:
  friend class Group;
  explicit Dataset(Handle handle) noexcept : Object(std::move(handle)) {}
};

/// An open HDF5 group. Names may be paths relative to this group ("a/b/c") or absolute ("/a").
class Group : public Object {
 public:
  /// An empty handle; every operation on it throws InternalError.
  Group() = default;

  /// Creates group `name`, creating missing intermediate groups ("a/b/c"). Throws
  /// InternalError when `name` exists already or an intermediate is not a group.
  Group create_group(const std::string& name);
  /// Opens group `name`, creating it (and intermediates) when missing.
  Group require_group(const std::string& name);
  /// Opens group `name`. Throws InternalError when it does not exist or is not a group.
  Group open_group(const std::string& name) const;
  /// True when a link `name` (group or dataset, possibly nested "a/b") exists.
  bool exists(const std::string& name) const;
  /// True when `name` exists and is a group.
  bool is_group(const std::string& name) const;
  /// The names of this group's direct members (groups and datasets), sorted by name.
  std::vector<std::string> children() const;

  /// Writes `data` (C row-major order) as a new dataset of shape `dims` (empty dims: a scalar)
  /// and element type T, creating intermediate groups. Datasets over 64 KiB are chunked
  /// (~256 KiB chunks, whole trailing axes) and compressed with shuffle + gzip level 4;
  /// smaller ones are contiguous. Throws InternalError when data.size() differs from the
  /// product of dims or `name` exists already.
  template <DatasetElement T>
  Dataset write_dataset(const std::string& name, const std::vector<T>& data,
                        const std::vector<hsize_t>& dims);
  /// Writes `data` as a 1-D dataset [data.size()].
  template <DatasetElement T>
  Dataset write_dataset(const std::string& name, const std::vector<T>& data) {
    return write_dataset(name, data, {static_cast<hsize_t>(data.size())});
  }
  /// Writes `data` as a new dataset of shape `dims` (at least one axis; dims[0] may be 0) whose
  /// first axis is unlimited, so that Dataset::append can add rows later; the trailing axes
  /// are fixed and must not be 0. Chunked for appends of one row at a time, so that appending
  /// rewrites no chunk already written (h5.cpp says why): rows under 16 KiB in uncompressed
  /// chunks of ~64 KiB of whole rows (at most 1024 rows), larger rows in chunks of one row
  /// (split along its slowest axes when over 64 KiB), compressed as write_dataset's. h5py
  /// reads it as any other dataset. Throws InternalError when data.size() differs from the
  /// product of dims, a trailing axis is 0, or `name` exists already.
  template <DatasetElement T>
  Dataset write_extendible(const std::string& name, const std::vector<T>& data,
                           const std::vector<hsize_t>& dims);
  /// Writes `data` as an extendible 1-D dataset [data.size()].
  template <DatasetElement T>
  Dataset write_extendible(const std::string& name, const std::vector<T>& data) {
    return write_extendible(name, data, {static_cast<hsize_t>(data.size())});
  }
  /// Writes a 1-D dataset [n] of variable-length UTF-8 strings. Throws InternalError when
  /// `name` exists already.
  Dataset write_strings(const std::string& name, const std::vector<std::string>& data);
  /// Writes a scalar variable-length UTF-8 string dataset (e.g. a config file verbatim).
  Dataset write_string(const std::string& name, const std::string& text);
  /// Opens dataset `name`. Throws InternalError when it does not exist or is not a dataset.
  Dataset open_dataset(const std::string& name) const;

 private:
  friend class File;
  explicit Group(Handle handle) noexcept : Object(std::move(handle)) {}
  /// How create_dataset lays a dataset out: contiguous or compressed chunks (`compressible`,
  /// by size), or uncompressed chunks with an unlimited first axis (`extendible`).
  enum class Storage { fixed, compressible, extendible };
  Dataset create_dataset(const std::string& name, hid_t file_type, hid_t mem_type,
                         const std::vector<hsize_t>& dims, std::size_t count, const void* data,
                         Storage storage);
};

/// An open HDF5 file. Groups and datasets opened from it stay usable after the File is
/// destroyed; the file itself is closed when its last object is closed (HDF5's default
/// "weak" close degree).
class File {
 public:
  /// An empty handle.
  File() = default;

  /// Creates (truncating) the file at `path` for writing. Throws UserError naming the path
  /// when it cannot be created (missing directory, no permission).
  static File create(const std::string& path);
  /// Opens the existing HDF5 file at `path` read-only. Throws UserError naming the path when
  /// it is missing, unreadable or not an HDF5 file.
  static File open(const std::string& path);
  /// Opens the existing HDF5 file at `path` for reading and writing, in place (no temporary
  /// file: what is written goes into `path` itself, on disk at flush() or close()). Objects
  /// created through it use the same object format as create(). Throws UserError naming the
  /// path when it is missing, not an HDF5 file, or cannot be opened for writing: no write
  /// permission, or another process has it open (HDF5 >= 1.10 locks a file while it is open;
  /// an h5py session reading it is enough), or this process has it open already.
  static File open_rw(const std::string& path);

  /// The root group "/".
  Group root() const;
  /// Writes buffered data and metadata to disk (so a crashed run leaves a readable file).
  void flush();
  /// Closes the file now, reporting a failure as InternalError (the destructor cannot).
  void close();

  hid_t id() const noexcept { return handle_.id(); }
  bool valid() const noexcept { return handle_.valid(); }
  /// The path given to create/open.
  const std::string& path() const noexcept { return path_; }

 private:
  File(Handle handle, std::string path) noexcept
      : handle_(std::move(handle)), path_(std::move(path)) {}

  Handle handle_;
  std::string path_;
};

}  // namespace ppb::h5
