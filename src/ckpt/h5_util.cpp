#include "h5_util.hpp"

#include <mutex>
#include <vector>

#include "pdtrain/ckpt/zstd_filter.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "precompress.hpp"

namespace pdtrain::ckpt {
namespace {

// The innermost H5Context. HDF5 runs on one thread only (see h5_check.hpp), so one global
// context is enough; thread_local keeps a stray second thread from garbling it.
thread_local std::string g_file, g_object;

herr_t collect_error(unsigned n, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  if (n < 3) {  // the innermost few frames say what went wrong
    std::string s = e->func_name ? e->func_name : "?";
    if (e->desc && *e->desc) s += std::string(": ") + e->desc;
    out->push_back(s);
  }
  return 0;
}

std::string error_stack_text() {
  std::vector<std::string> lines;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &lines);
  H5Eclear2(H5E_DEFAULT);
  std::string s;
  for (const auto& l : lines) s += (s.empty() ? "" : "; ") + l;
  return s;
}

}  // namespace

H5Context::H5Context(std::string file, std::string object)
    : saved_file_(g_file), saved_object_(g_object) {
  g_file = std::move(file);
  g_object = std::move(object);
}

H5Context::~H5Context() {
  g_file = saved_file_;
  g_object = saved_object_;
}

std::string h5_context_text() {
  if (g_file.empty()) return "";
  std::string s = "checkpoint " + g_file;
  if (!g_object.empty()) s += ", " + g_object;
  return s;
}

void h5_fail(const char* call, const char* file, int line, ExitCode code) {
  std::string msg;
  const std::string ctx = h5_context_text();
  if (!ctx.empty()) msg = ctx + ": ";
  msg += "HDF5 call failed at " + where(file, line) + " (rank " + std::to_string(world_rank()) +
         "): " + call;
  const std::string stack = error_stack_text();
  if (!stack.empty()) msg += " [" + stack + "]";
  throw Error(code, msg);
}

void ensure_hdf5_ready() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (H5open() < 0) throw Error(ExitCode::runtime, "cannot initialize the HDF5 library");
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors are reported by H5_CHECK
    // Registered unconditionally (not only when H5Zfilter_avail says no): that call would load
    // a plugin from HDF5_PLUGIN_PATH, which lacks the in-process hook of the async writer.
    if (H5Zregister(zstd_filter_class()) < 0)
      throw Error(ExitCode::runtime, "cannot register the zstd HDF5 filter (id 32015)");
    detail::PrecompressedChunks::install();
  });
}

void H5Id::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    default: break;
  }
  id_ = H5I_INVALID_HID;
}

void H5Id::close_checked(const char* file, int line) {
  if (id_ < 0) return;
  const hid_t id = id_;
  id_ = H5I_INVALID_HID;
  herr_t rc = 0;
  switch (H5Iget_type(id)) {
    case H5I_FILE: rc = H5Fclose(id); break;
    case H5I_DATASET: rc = H5Dclose(id); break;
    case H5I_GROUP: rc = H5Gclose(id); break;
    default: H5Id(id).reset(); break;
  }
  if (rc < 0) h5_fail("close", file, line);
}

const char* built_plugin_dir() {
#ifdef PDTRAIN_HDF5_PLUGIN_DIR
  return PDTRAIN_HDF5_PLUGIN_DIR;
#else
  return "";
#endif
}

namespace detail {

void write_attr_i64(hid_t obj, const char* name, std::int64_t value) {
  H5Id space(H5_CHECK(H5Screate(H5S_SCALAR)));
  H5Id attr(H5_CHECK(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)));
  H5_CHECK(H5Awrite(attr, H5T_NATIVE_INT64, &value));
}

void write_attr_str(hid_t obj, const char* name, const std::string& value) {
  H5Id type(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(type, value.size() + 1));
  H5_CHECK(H5Tset_strpad(type, H5T_STR_NULLTERM));
  H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  H5Id space(H5_CHECK(H5Screate(H5S_SCALAR)));
  H5Id attr(H5_CHECK(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT)));
  H5_CHECK(H5Awrite(attr, type, value.c_str()));
}

std::optional<std::int64_t> read_attr_i64(hid_t obj, const char* name) {
  if (H5_CHECK(H5Aexists(obj, name)) <= 0) return std::nullopt;
  H5Id attr(H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT)));
  H5Id type(H5_CHECK(H5Aget_type(attr)));
  if (H5_CHECK(H5Tget_class(type)) != H5T_INTEGER) return std::nullopt;
  std::int64_t v = 0;
  H5_CHECK(H5Aread(attr, H5T_NATIVE_INT64, &v));
  return v;
}

std::optional<std::string> read_attr_str(hid_t obj, const char* name) {
  if (H5_CHECK(H5Aexists(obj, name)) <= 0) return std::nullopt;
  H5Id attr(H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT)));
  H5Id type(H5_CHECK(H5Aget_type(attr)));
  if (H5_CHECK(H5Tget_class(type)) != H5T_STRING || H5_CHECK(H5Tis_variable_str(type)) > 0)
    return std::nullopt;
  const std::size_t n = H5Tget_size(type);  // 0 on failure: an empty string
  std::string s(n, '\0');
  H5Id mem(H5_CHECK(H5Tcopy(type)));
  H5_CHECK(H5Aread(attr, mem, s.data()));
  s.resize(s.find('\0') == std::string::npos ? n : s.find('\0'));
  return s;
}

H5Id open_read_only(const std::string& path) {
  ensure_hdf5_ready();
  H5Context ctx(path, "");
  return H5Id(H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)));
}

bool exists(hid_t loc, const std::string& path) {
  // H5Lexists needs every intermediate link to exist, so walk the path one name at a time.
  std::size_t pos = 0;
  while (true) {
    const std::size_t slash = path.find('/', pos);
    const std::string prefix = path.substr(0, slash);
    if (H5_CHECK(H5Lexists(loc, prefix.c_str(), H5P_DEFAULT)) <= 0) return false;
    if (slash == std::string::npos) return true;
    pos = slash + 1;
  }
}

}  // namespace detail
}  // namespace pdtrain::ckpt
