// Unit tests of src/results/h5: round trips of every attribute and dataset type, nested groups,
// attribute overwrite (in place, without growing a file opened again and again), storage
// conventions h5py relies on (checked with the C API), extendible datasets appended in a file
// opened read-write, error paths (dims mismatch, missing / non-HDF5 files, read-only writes)
// and handle ownership (moves, no leaked identifiers).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "results/h5.h"

namespace {

using ppb::InternalError;
using ppb::UserError;
namespace h5 = ppb::h5;

// Identifiers of every kind open in every file: 0 when nothing leaked.
ssize_t open_ids() { return H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL); }

class H5Test : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ppb_test_h5_XXXXXX";
    int fd = mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    close(fd);
    path_ = tmpl;
    ids_before_ = open_ids();
  }
  void TearDown() override {
    EXPECT_EQ(open_ids(), ids_before_) << "HDF5 identifiers leaked";
    std::remove(path_.c_str());
  }

  std::string path_;
  ssize_t ids_before_ = 0;
};

// A storage property of an attribute, through the C API.
struct AttrType {
  H5T_class_t cls;
  std::size_t size;
  bool variable_str;
  H5T_cset_t cset;
  int rank;
};

AttrType attr_type(hid_t obj, const char* name) {
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  hid_t t = H5Aget_type(a);
  hid_t s = H5Aget_space(a);
  AttrType r{H5Tget_class(t), H5Tget_size(t), false, H5T_CSET_ERROR,
             H5Sget_simple_extent_ndims(s)};
  if (r.cls == H5T_STRING) {
    r.variable_str = H5Tis_variable_str(t) > 0;
    r.cset = H5Tget_cset(t);
  }
  H5Sclose(s);
  H5Tclose(t);
  H5Aclose(a);
  return r;
}

TEST_F(H5Test, AttributesRoundTripEveryType) {
  const std::string utf8 = "µs — naïve 日本語";
  {
    auto f = h5::File::create(path_);
    auto g = f.root().create_group("config");
    g.set_attr("i64", std::int64_t{-1234567890123});
    g.set_attr("int", 42);
    g.set_attr("size", std::size_t{7});
    g.set_attr("dbl", 2.5e-9);
    g.set_attr("yes", true);
    g.set_attr("no", false);
    g.set_attr("str", utf8);
    g.set_attr("lit", "literal");  // must not become a bool
    g.set_attr("empty_str", std::string());
    g.set_attr("vd", std::vector<double>{1.5, -2.0, 3.25});
    g.set_attr("vi", std::vector<std::int64_t>{1, -2, std::numeric_limits<std::int64_t>::max()});
    g.set_attr("vint", std::vector<int>{3, 4});
    g.set_attr("vs", std::vector<std::string>{"a", "", utf8});
    g.set_attr("vd_empty", std::vector<double>{});
    g.set_attr("vs_empty", std::vector<std::string>{});
  }
  auto f = h5::File::open(path_);
  auto g = f.root().open_group("config");
  EXPECT_EQ(g.get_attr<std::int64_t>("i64"), -1234567890123);
  EXPECT_EQ(g.get_attr<int>("int"), 42);
  EXPECT_EQ(g.get_attr<std::int64_t>("size"), 7);
  EXPECT_EQ(g.get_attr<double>("dbl"), 2.5e-9);
  EXPECT_EQ(g.get_attr<double>("int"), 42.0);  // int64 storage read as double
  EXPECT_TRUE(g.get_attr<bool>("yes"));
  EXPECT_FALSE(g.get_attr<bool>("no"));
  EXPECT_EQ(g.get_attr<std::string>("str"), utf8);
  EXPECT_EQ(g.get_attr<std::string>("lit"), "literal");
  EXPECT_EQ(g.get_attr<std::string>("empty_str"), "");
  EXPECT_EQ(g.get_attr<std::vector<double>>("vd"), (std::vector<double>{1.5, -2.0, 3.25}));
  EXPECT_EQ(g.get_attr<std::vector<std::int64_t>>("vi"),
            (std::vector<std::int64_t>{1, -2, std::numeric_limits<std::int64_t>::max()}));
  EXPECT_EQ(g.get_attr<std::vector<std::int64_t>>("vint"), (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(g.get_attr<std::vector<std::string>>("vs"),
            (std::vector<std::string>{"a", "", utf8}));
  EXPECT_TRUE(g.get_attr<std::vector<double>>("vd_empty").empty());
  EXPECT_TRUE(g.get_attr<std::vector<std::string>>("vs_empty").empty());
  EXPECT_EQ(g.get_attr<std::vector<std::int64_t>>("int"), std::vector<std::int64_t>{42});

  EXPECT_TRUE(g.has_attr("str"));
  EXPECT_FALSE(g.has_attr("nope"));
  EXPECT_EQ(g.attr_names(),
            (std::vector<std::string>{"dbl", "empty_str", "i64", "int", "lit", "no", "size",
                                      "str", "vd", "vd_empty", "vi", "vint", "vs", "vs_empty",
                                      "yes"}));

  // Storage conventions h5py relies on.
  AttrType s = attr_type(g.id(), "str");
  EXPECT_EQ(s.cls, H5T_STRING);
  EXPECT_TRUE(s.variable_str);
  EXPECT_EQ(s.cset, H5T_CSET_UTF8);
  EXPECT_EQ(s.rank, 0);
  AttrType b = attr_type(g.id(), "yes");
  EXPECT_EQ(b.cls, H5T_INTEGER);
  EXPECT_EQ(b.size, 1u);
  AttrType i = attr_type(g.id(), "int");
  EXPECT_EQ(i.cls, H5T_INTEGER);
  EXPECT_EQ(i.size, 8u);
  AttrType vs = attr_type(g.id(), "vs");
  EXPECT_TRUE(vs.variable_str);
  EXPECT_EQ(vs.cset, H5T_CSET_UTF8);
  EXPECT_EQ(vs.rank, 1);
}

TEST_F(H5Test, AttributeErrors) {
  auto f = h5::File::create(path_);
  auto g = f.root();
  g.set_attr("s", "text");
  g.set_attr("v", std::vector<double>{1, 2});
  g.set_attr("big", std::int64_t{1} << 40);
  EXPECT_THROW(g.get_attr<double>("missing"), InternalError);
  EXPECT_THROW(g.get_attr<double>("s"), InternalError);       // string, not a number
  EXPECT_THROW(g.get_attr<std::string>("v"), InternalError);  // numbers, not a string
  EXPECT_THROW(g.get_attr<double>("v"), InternalError);       // two values, not one
  EXPECT_THROW(g.get_attr<int>("big"), InternalError);        // out of int range
  EXPECT_THROW(g.set_attr("u", std::numeric_limits<std::uint64_t>::max()), InternalError);
  EXPECT_THROW(g.delete_attr("missing"), InternalError);
  g.delete_attr("s");
  EXPECT_FALSE(g.has_attr("s"));
}

TEST_F(H5Test, OverwriteAttributeReplacesValueAndType) {
  auto f = h5::File::create(path_);
  auto g = f.root();
  g.set_attr("complete", 0);
  g.set_attr("complete", 1);
  EXPECT_EQ(g.get_attr<int>("complete"), 1);
  g.set_attr("x", std::vector<double>{1, 2, 3});
  g.set_attr("x", "now a string");
  EXPECT_EQ(g.get_attr<std::string>("x"), "now a string");
  // An equal string is not written again, but a scalar and a [1] array are not equal.
  g.set_attr("x", std::vector<std::string>{"now a string"});
  EXPECT_EQ(attr_type(g.id(), "x").rank, 1);
  g.set_attr("x", "now a string");
  EXPECT_EQ(attr_type(g.id(), "x").rank, 0);
  g.set_attr("complete", 2.5);  // int64 -> float64: replaced, not written in place
  EXPECT_EQ(attr_type(g.id(), "complete").cls, H5T_FLOAT);
  EXPECT_EQ(g.get_attr<double>("complete"), 2.5);
  EXPECT_EQ(g.attr_names(), (std::vector<std::string>{"complete", "x"}));
}

TEST_F(H5Test, LargeAttributeFits) {
  // The 1.6 object format HDF5 uses by default cannot store attributes over 64 KiB.
  std::vector<double> big(20000, 0.5);
  {
    auto f = h5::File::create(path_);
    f.root().set_attr("big", big);
  }
  EXPECT_EQ(h5::File::open(path_).root().get_attr<std::vector<double>>("big"), big);
}

TEST_F(H5Test, NestedGroups) {
  {
    auto f = h5::File::create(path_);
    auto root = f.root();
    auto c = root.create_group("a/b/c");
    EXPECT_EQ(c.path(), "/a/b/c");
    root.create_group("a/b2");
    EXPECT_THROW(root.create_group("a/b"), InternalError);  // exists already
    auto b = root.require_group("a/b");
    EXPECT_EQ(b.path(), "/a/b");
    auto d = b.require_group("d");
    EXPECT_EQ(d.path(), "/a/b/d");
    d.write_dataset("x", std::vector<double>{1.0});
  }
  auto f = h5::File::open(path_);
  auto root = f.root();
  EXPECT_TRUE(root.exists("a"));
  EXPECT_TRUE(root.exists("a/b/c"));
  EXPECT_TRUE(root.exists("/a/b/c"));
  EXPECT_TRUE(root.exists("/"));
  EXPECT_FALSE(root.exists("a/zz/c"));  // missing intermediate: false, not an error
  EXPECT_FALSE(root.exists("a/b/d/x/y"));  // through a dataset
  EXPECT_FALSE(root.exists(""));
  EXPECT_TRUE(root.is_group("a/b"));
  EXPECT_FALSE(root.is_group("a/b/d/x"));
  EXPECT_TRUE(root.exists("a/b/d/x"));
  EXPECT_EQ(root.children(), std::vector<std::string>{"a"});
  EXPECT_EQ(root.open_group("a").children(), (std::vector<std::string>{"b", "b2"}));
  EXPECT_EQ(root.open_group("a/b").children(), (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(root.open_group("a").open_group("b/c").path(), "/a/b/c");
  EXPECT_THROW(root.open_group("a/missing"), InternalError);
  EXPECT_THROW(root.open_group("a/b/d/x"), InternalError);  // a dataset
  EXPECT_THROW(root.open_dataset("a/b"), InternalError);    // a group
  EXPECT_THROW(root.open_dataset("nope"), InternalError);
}

TEST_F(H5Test, DatasetsRoundTripEveryType) {
  const std::vector<double> d{0.0, 1.5, -2.25, 1e300, 5.0, 6.0};
  const std::vector<float> fl{1.5f, -2.5f, 3.0f, 4.0f};
  const std::vector<std::int32_t> i32{std::numeric_limits<std::int32_t>::min(), 0, 7};
  const std::vector<std::int64_t> i64{std::numeric_limits<std::int64_t>::min(), -1,
                                      std::numeric_limits<std::int64_t>::max(), 3};
  const std::vector<std::uint8_t> u8{0, 1, 255};
  const std::vector<std::string> names{"embed", "layer.0", "", "lm_head — µ"};
  const std::string json = "{\n  \"name\": \"tiny\", \"layers\": 2\n}\n";
  {
    auto f = h5::File::create(path_);
    auto g = f.root().create_group("data");
    auto ds = g.write_dataset("d", d, {2, 3});
    ds.set_attr("units", "s");
    g.write_dataset("f", fl, {2, 2});
    g.write_dataset("i32", i32);
    g.write_dataset("i64", i64, {4});
    g.write_dataset("u8", u8, {3, 1});
    g.write_dataset("scalar", std::vector<double>{3.5}, {});
    g.write_dataset("empty", std::vector<double>{}, {0});
    g.write_dataset("sub/dir/x", std::vector<std::int32_t>{1, 2});  // intermediate groups
    g.write_strings("names", names);
    g.write_strings("no_names", {});
    g.write_string("config_json", json);
  }
  auto f = h5::File::open(path_);
  auto g = f.root().open_group("data");
  auto ds = g.open_dataset("d");
  EXPECT_EQ(ds.dims(), (std::vector<hsize_t>{2, 3}));
  EXPECT_EQ(ds.size(), 6u);
  EXPECT_EQ(ds.read<double>(), d);
  EXPECT_EQ(ds.get_attr<std::string>("units"), "s");
  EXPECT_EQ(ds.attr_names(), std::vector<std::string>{"units"});
  EXPECT_EQ(g.open_dataset("f").read<float>(), fl);
  EXPECT_EQ(g.open_dataset("f").read<double>(), (std::vector<double>{1.5, -2.5, 3.0, 4.0}));
  EXPECT_EQ(g.open_dataset("i32").read<std::int32_t>(), i32);
  EXPECT_EQ(g.open_dataset("i32").dims(), std::vector<hsize_t>{3});
  EXPECT_EQ(g.open_dataset("i64").read<std::int64_t>(), i64);
  EXPECT_EQ(g.open_dataset("u8").read<std::uint8_t>(), u8);
  EXPECT_EQ(g.open_dataset("u8").read<std::int64_t>(), (std::vector<std::int64_t>{0, 1, 255}));
  EXPECT_EQ(g.open_dataset("u8").dims(), (std::vector<hsize_t>{3, 1}));
  auto scalar = g.open_dataset("scalar");
  EXPECT_TRUE(scalar.dims().empty());
  EXPECT_EQ(scalar.size(), 1u);
  EXPECT_EQ(scalar.read<double>(), std::vector<double>{3.5});
  EXPECT_EQ(g.open_dataset("empty").dims(), std::vector<hsize_t>{0});
  EXPECT_TRUE(g.open_dataset("empty").read<double>().empty());
  EXPECT_EQ(g.open_dataset("sub/dir/x").read<std::int32_t>(), (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(g.open_dataset("names").read_strings(), names);
  EXPECT_TRUE(g.open_dataset("no_names").read_strings().empty());
  EXPECT_EQ(g.open_dataset("config_json").read_string(), json);
  EXPECT_TRUE(g.open_dataset("config_json").dims().empty());
  EXPECT_THROW(g.open_dataset("names").read<double>(), InternalError);
  EXPECT_THROW(g.open_dataset("d").read_strings(), InternalError);
  EXPECT_THROW(g.open_dataset("names").read_string(), InternalError);  // 4 strings, not 1
}

TEST_F(H5Test, DatasetDimsMismatchThrows) {
  auto f = h5::File::create(path_);
  auto g = f.root();
  EXPECT_THROW(g.write_dataset("a", std::vector<double>{1, 2, 3}, {2, 2}), InternalError);
  EXPECT_THROW(g.write_dataset("b", std::vector<double>{1, 2}, {}), InternalError);
  EXPECT_THROW(g.write_dataset("c", std::vector<float>{}, {1}), InternalError);
  EXPECT_FALSE(g.exists("a"));
  g.write_dataset("d", std::vector<double>{1});
  EXPECT_THROW(g.write_dataset("d", std::vector<double>{1}), InternalError);  // exists
}

TEST_F(H5Test, LargeDatasetsAreChunkedAndCompressed) {
  // [iters=50][M=4][G+1=17][S=4][6] event timestamps: 326 400 B > 64 KiB.
  std::vector<hsize_t> dims{50, 4, 17, 4, 6};
  std::vector<double> events(50 * 4 * 17 * 4 * 6);
  for (std::size_t i = 0; i < events.size(); ++i) events[i] = 1.0 + 1e-6 * static_cast<double>(i);
  {
    auto f = h5::File::create(path_);
    f.root().write_dataset("events", events, dims);
    f.root().write_dataset("small", std::vector<double>(1000, 1.0));  // 8000 B
    f.flush();
  }
  auto f = h5::File::open(path_);
  auto big = f.root().open_dataset("events");
  EXPECT_EQ(big.dims(), dims);
  EXPECT_EQ(big.read<double>(), events);

  hid_t dcpl = H5Dget_create_plist(big.id());
  EXPECT_EQ(H5Pget_layout(dcpl), H5D_CHUNKED);
  hsize_t chunk[5] = {};
  ASSERT_EQ(H5Pget_chunk(dcpl, 5, chunk), 5);
  EXPECT_LE(chunk[0] * chunk[1] * chunk[2] * chunk[3] * chunk[4] * 8, 256u * 1024);
  EXPECT_EQ(chunk[1], 4u);  // whole trailing axes
  EXPECT_EQ(chunk[4], 6u);
  EXPECT_EQ(H5Pget_nfilters(dcpl), 2);  // shuffle + deflate
  unsigned flags = 0;
  std::size_t nvals = 1;
  unsigned level = 0;
  EXPECT_EQ(H5Pget_filter_by_id2(dcpl, H5Z_FILTER_DEFLATE, &flags, &nvals, &level, 0, nullptr,
                                 nullptr),
            0);
  EXPECT_EQ(level, 4u);
  H5Pclose(dcpl);
  EXPECT_LT(H5Dget_storage_size(big.id()), events.size() * sizeof(double));

  dcpl = H5Dget_create_plist(f.root().open_dataset("small").id());
  EXPECT_EQ(H5Pget_layout(dcpl), H5D_CONTIGUOUS);
  H5Pclose(dcpl);
}

// The dataspace's maxdims and the chunk shape of dataset `ds`, through the C API.
struct Layout {
  std::vector<hsize_t> maxdims, chunk;
  int filters = -1;
};

Layout layout_of(const h5::Dataset& ds) {
  Layout l;
  hid_t space = H5Dget_space(ds.id());
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  l.maxdims.resize(dims.size());
  H5Sget_simple_extent_dims(space, dims.data(), l.maxdims.data());
  H5Sclose(space);
  hid_t dcpl = H5Dget_create_plist(ds.id());
  if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
    l.chunk.resize(dims.size());
    H5Pget_chunk(dcpl, rank, l.chunk.data());
    l.filters = H5Pget_nfilters(dcpl);
  }
  H5Pclose(dcpl);
  return l;
}

TEST_F(H5Test, ExtendibleDatasetAppendedOneThenThreeThenTwoRowsReadsBackAllSixInOrder) {
  // Rows of [2][3] int32: row r holds 100 r + 0 .. 5. Each append in a file opened again.
  auto rows = [](int first, int n) {
    std::vector<std::int32_t> v;
    for (int r = first; r < first + n; ++r)
      for (int i = 0; i < 6; ++i) v.push_back(100 * r + i);
    return v;
  };
  {
    auto f = h5::File::create(path_);
    auto ds = f.root().write_extendible("g/rows", std::vector<std::int32_t>{}, {0, 2, 3});
    EXPECT_TRUE(ds.extendible());
    EXPECT_EQ(ds.dims(), (std::vector<hsize_t>{0, 2, 3}));
  }
  int done = 0;
  for (int n : {1, 3, 2}) {
    auto f = h5::File::open_rw(path_);
    auto ds = f.root().open_dataset("g/rows");
    ds.append(rows(done, n));
    done += n;
    EXPECT_EQ(ds.dims(), (std::vector<hsize_t>{static_cast<hsize_t>(done), 2, 3}));
    f.flush();
  }
  auto f = h5::File::open(path_);
  auto ds = f.root().open_dataset("g/rows");
  EXPECT_EQ(ds.dims(), (std::vector<hsize_t>{6, 2, 3}));
  EXPECT_EQ(ds.read<std::int32_t>(), rows(0, 6));
  const Layout l = layout_of(ds);
  EXPECT_EQ(l.maxdims, (std::vector<hsize_t>{H5S_UNLIMITED, 2, 3}));
  EXPECT_EQ(l.chunk, (std::vector<hsize_t>{1024, 2, 3}));  // 1024 rows of 24 B: the row cap
  EXPECT_EQ(l.filters, 0);                                 // uncompressed: appends rewrite no chunk
  hid_t type = H5Dget_type(ds.id());
  EXPECT_TRUE(H5Tequal(type, H5T_STD_I32LE) > 0);
  H5Tclose(type);
}

TEST_F(H5Test, ExtendibleDatasetsStartWithRowsAndChunkWholeRowsUpTo64KiB) {
  std::vector<double> events(3 * 2 * 5 * 2 * 6);  // 3 rows of 960 B (a tiny model's events)
  for (std::size_t i = 0; i < events.size(); ++i) events[i] = 0.5 * static_cast<double>(i);
  std::vector<double> wide(2 * 4 * 129 * 8 * 6, 1.5);  // 2 rows of 198 KiB
  {
    auto f = h5::File::create(path_);
    auto root = f.root();
    root.write_extendible("events", events, {3, 2, 5, 2, 6});
    root.write_extendible("wall_s", std::vector<double>{0.25, 0.5});
    root.write_extendible("wide", wide, {2, 4, 129, 8, 6});
  }
  {
    auto f = h5::File::open_rw(path_);
    auto root = f.root();
    std::vector<double> more(2 * 5 * 2 * 6, -1.0);
    root.open_dataset("events").append(more);
    root.open_dataset("wall_s").append(std::vector<double>{0.75});
    root.open_dataset("wide").append(wide.data(), wide.size() / 2);  // the first row again
    events.insert(events.end(), more.begin(), more.end());
    // (through a copy: inserting a range of the vector into itself is undefined)
    const auto half = static_cast<std::ptrdiff_t>(wide.size() / 2);
    const std::vector<double> first_row(wide.begin(), wide.begin() + half);
    wide.insert(wide.end(), first_row.begin(), first_row.end());
  }
  auto f = h5::File::open(path_);
  auto root = f.root();
  EXPECT_EQ(root.open_dataset("events").dims(), (std::vector<hsize_t>{4, 2, 5, 2, 6}));
  EXPECT_EQ(root.open_dataset("events").read<double>(), events);
  EXPECT_EQ(root.open_dataset("wall_s").read<double>(), (std::vector<double>{0.25, 0.5, 0.75}));
  EXPECT_EQ(root.open_dataset("wide").dims(), (std::vector<hsize_t>{3, 4, 129, 8, 6}));
  EXPECT_EQ(root.open_dataset("wide").read<double>(), wide);
  // 65536 / 960 = 68 rows of events, uncompressed; 1024 rows of a scalar; a 198 KiB row in
  // chunks of one row, compressed, split along its slowest axis (4 -> 2 -> 1: 48 KiB).
  EXPECT_EQ(layout_of(root.open_dataset("events")).chunk, (std::vector<hsize_t>{68, 2, 5, 2, 6}));
  EXPECT_EQ(layout_of(root.open_dataset("events")).filters, 0);
  EXPECT_EQ(layout_of(root.open_dataset("wall_s")).chunk, (std::vector<hsize_t>{1024}));
  const auto wide_layout = layout_of(root.open_dataset("wide"));
  EXPECT_EQ(wide_layout.chunk, (std::vector<hsize_t>{1, 1, 129, 8, 6}));
  EXPECT_EQ(wide_layout.filters, 2);  // shuffle + deflate
}

TEST_F(H5Test, CompressedOneRowChunksAppendedOneByOneLeakNoSpace) {
  // 100 rows of 99 KB (a GPU run's events: M=8, G+1=129, S=2) appended one per opening of the
  // file: each append writes whole new chunks, compressed once, so the file holds the chunks
  // and little else.
  const std::vector<hsize_t> row{8, 129, 2, 6};
  const std::size_t n = 8 * 129 * 2 * 6;
  std::uint64_t lcg = 12345;
  auto make_row = [&](int r) {
    std::vector<double> v(n);
    for (std::size_t i = 0; i < n; ++i) {
      lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
      v[i] = 10.0 * r + 1e-4 * static_cast<double>(i) + 1e-7 * static_cast<double>(lcg >> 44);
    }
    return v;
  };
  std::vector<double> all = make_row(0);
  {
    auto f = h5::File::create(path_);
    f.root().write_extendible("events", all, {1, 8, 129, 2, 6});
  }
  for (int r = 1; r < 100; ++r) {
    auto f = h5::File::open_rw(path_);
    const auto v = make_row(r);
    f.root().open_dataset("events").append(v);
    all.insert(all.end(), v.begin(), v.end());
  }
  auto f = h5::File::open(path_);
  auto ds = f.root().open_dataset("events");
  EXPECT_EQ(ds.dims(), (std::vector<hsize_t>{100, 8, 129, 2, 6}));
  EXPECT_EQ(ds.read<double>(), all);
  const auto stored = H5Dget_storage_size(ds.id());
  const auto file = std::filesystem::file_size(path_);
  EXPECT_LT(stored, all.size() * sizeof(double) * 3 / 4);  // compressed
  EXPECT_LT(file - stored, 256u * 1024) << "file " << file << " B, chunks " << stored << " B";
}

TEST_F(H5Test, AppendErrors) {
  auto f = h5::File::create(path_);
  auto root = f.root();
  auto fixed = root.write_dataset("fixed", std::vector<double>{1, 2});
  EXPECT_FALSE(fixed.extendible());
  EXPECT_THROW(fixed.append(std::vector<double>{3}), InternalError);
  auto ext = root.write_extendible("ext", std::vector<double>{1, 2, 3, 4}, {2, 2});
  EXPECT_THROW(ext.append(std::vector<double>{5}), InternalError);  // half a row
  ext.append(std::vector<double>{});                                // nothing: no-op
  EXPECT_EQ(ext.dims(), (std::vector<hsize_t>{2, 2}));
  EXPECT_THROW(root.write_extendible("zero", std::vector<double>{}, {0, 0}), InternalError);
  EXPECT_THROW(root.write_extendible("scalar", std::vector<double>{1}, {}), InternalError);
  EXPECT_THROW(root.write_extendible("ext", std::vector<double>{1}), InternalError);  // exists
  EXPECT_THROW(root.write_extendible("bad", std::vector<double>{1, 2, 3}, {2, 2}), InternalError);
}

TEST_F(H5Test, OpenRwWritesInPlaceAndRefusesWhatItCannotOpen) {
  {
    auto f = h5::File::create(path_);
    f.root().set_attr("status", "running");
  }
  {
    auto f = h5::File::open_rw(path_);
    f.root().set_attr("status", "complete");
    f.root().create_group("late").set_attr("n", 3);
    f.flush();
  }
  {
    auto f = h5::File::open(path_);
    EXPECT_EQ(f.root().get_attr<std::string>("status"), "complete");
    EXPECT_EQ(f.root().open_group("late").get_attr<int>("n"), 3);
    // Open in this process already (read-only): HDF5 refuses a second, writing, opening.
    try {
      h5::File::open_rw(path_);
      FAIL() << "no exception";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("for writing"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(h5::File::open_rw(path_ + ".does_not_exist"), UserError);
  EXPECT_THROW(h5::File::open_rw("/tmp"), UserError);
  {
    std::ofstream out(path_);
    out << "not HDF5\n";
  }
  EXPECT_THROW(h5::File::open_rw(path_), UserError);
}

TEST_F(H5Test, NumberAttributesOverwrittenInPlaceDoNotGrowTheFile) {
  {
    auto f = h5::File::create(path_);
    auto root = f.root();
    for (int i = 0; i < 20; ++i) root.set_attr("a" + std::to_string(i), 0.0);  // dense storage
    root.set_attr("status", "running: benchmark");
    root.set_attr("order", std::vector<std::string>{"uniform", "balanced"});
  }
  auto size = [&] { return std::filesystem::file_size(path_); };
  auto once = [&](int i) {
    auto f = h5::File::open_rw(path_);
    auto root = f.root();
    root.set_attr("a3", 0.5 * i);
    root.set_attr("a7", std::int64_t{i});  // was a double: replaced (type changes once)
    root.set_attr("status", "running: benchmark");  // unchanged strings: not written again
    root.set_attr("order", std::vector<std::string>{"uniform", "balanced"});
  };
  once(0);
  const auto after_first = size();
  for (int i = 1; i < 200; ++i) once(i);
  EXPECT_EQ(size(), after_first);
  auto f = h5::File::open(path_);
  EXPECT_EQ(f.root().get_attr<double>("a3"), 0.5 * 199);
  EXPECT_EQ(f.root().get_attr<std::int64_t>("a7"), 199);
  EXPECT_EQ(f.root().get_attr<std::string>("status"), "running: benchmark");
  EXPECT_EQ(f.root().get_attr<std::vector<std::string>>("order"),
            (std::vector<std::string>{"uniform", "balanced"}));
}

TEST_F(H5Test, OpenMissingOrNonHdf5FileThrowsUserError) {
  const std::string missing = path_ + ".does_not_exist";
  try {
    h5::File::open(missing);
    FAIL() << "no exception";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  {
    std::ofstream out(path_);
    out << "this is plain text, not HDF5\n";
  }
  try {
    h5::File::open(path_);
    FAIL() << "no exception";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
  }
  EXPECT_THROW(h5::File::open("/tmp"), UserError);  // a directory
  EXPECT_THROW(h5::File::create("/nonexistent_dir_ppb/x.h5"), UserError);
}

TEST_F(H5Test, FailingCallReportsCallFileLineAndStack) {
  { h5::File::create(path_); }
  auto f = h5::File::open(path_);  // read-only
  auto root = f.root();
  try {
    root.set_attr("x", 1);
    FAIL() << "no exception";
  } catch (const InternalError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("H5Acreate2("), std::string::npos) << msg;  // the call's text
    EXPECT_NE(msg.find("h5.cpp:"), std::string::npos) << msg;      // where
    EXPECT_NE(msg.find("host "), std::string::npos) << msg;
    EXPECT_NE(msg.find("H5Acreate2(): "), std::string::npos) << msg;  // HDF5's own message
  }
}

TEST_F(H5Test, MovesTransferOwnershipWithoutDoubleClose) {
  {
    auto f = h5::File::create(path_);
    EXPECT_EQ(open_ids(), ids_before_ + 1);
    h5::File f2 = std::move(f);
    EXPECT_FALSE(f.valid());  // NOLINT(bugprone-use-after-move): testing the moved-from state
    EXPECT_TRUE(f2.valid());
    EXPECT_EQ(open_ids(), ids_before_ + 1);

    h5::Group kept;
    hid_t id = H5I_INVALID_HID;
    {
      h5::Group g = f2.root().create_group("g");
      id = g.id();
      kept = std::move(g);
      EXPECT_FALSE(g.valid());  // NOLINT(bugprone-use-after-move)
    }  // the moved-from g is destroyed here: it must not close the id
    EXPECT_GT(H5Iis_valid(id), 0);
    EXPECT_EQ(kept.id(), id);
    kept.set_attr("still", "usable");
    EXPECT_EQ(open_ids(), ids_before_ + 2);  // file + group

    // Move-assigning onto a live handle closes its old id.
    h5::Group other = f2.root().create_group("h");
    hid_t other_id = other.id();
    EXPECT_EQ(open_ids(), ids_before_ + 3);
    other = std::move(kept);
    EXPECT_EQ(H5Iis_valid(other_id), 0);
    EXPECT_EQ(other.id(), id);
    EXPECT_EQ(open_ids(), ids_before_ + 2);

    h5::Dataset ds = f2.root().write_dataset("x", std::vector<double>{1, 2});
    h5::Dataset ds2(std::move(ds));
    EXPECT_FALSE(ds.valid());  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(ds2.read<double>(), (std::vector<double>{1, 2}));
    EXPECT_EQ(open_ids(), ids_before_ + 3);
  }
  EXPECT_EQ(open_ids(), ids_before_);
}

TEST_F(H5Test, ObjectsOutliveTheirFileAndExplicitClose) {
  h5::Group g;
  {
    auto f = h5::File::create(path_);
    g = f.root().create_group("g");
  }  // the file stays open until g closes (weak close degree)
  g.set_attr("late", 1.0);
  g = h5::Group();
  EXPECT_EQ(open_ids(), ids_before_);
  auto f = h5::File::open(path_);
  EXPECT_EQ(f.root().open_group("g").get_attr<double>("late"), 1.0);
  f.close();
  EXPECT_FALSE(f.valid());
  EXPECT_EQ(open_ids(), ids_before_);
}

TEST(H5Handle, EmptyHandlesAreHarmless) {
  h5::Handle h;
  EXPECT_FALSE(h.valid());
  h.reset();
  h.close();
  h5::Group g;
  EXPECT_THROW(g.children(), InternalError);
  h5::File f;
  EXPECT_THROW(f.root(), InternalError);
}

}  // namespace
