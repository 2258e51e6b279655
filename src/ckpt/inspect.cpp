// `pdtrain inspect CKPT`: what a checkpoint holds and whether every block verifies.
#include <algorithm>
#include <cstdio>
#include <ostream>
#include <filesystem>
#include <sstream>

#include "format.hpp"
#include "geometry.hpp"
#include "h5_util.hpp"
#include "pdtrain/ckpt/checkpoint.hpp"
#include "reader_impl.hpp"

namespace pdtrain::ckpt {
namespace {

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

struct Row {
  std::string name, shape;
  std::int64_t stored, raw;
};

// One dataset's line; raw is the fp32 bytes it stands for (for sign bits: the parameters).
void add_row(hid_t file, const std::string& name, std::int64_t raw, std::vector<Row>& rows) {
  if (!detail::exists(file, name)) return;
  H5Id d(H5_CHECK(H5Dopen2(file, name.c_str(), H5P_DEFAULT)));
  H5Id space(H5_CHECK(H5Dget_space(d)));
  hsize_t dims[H5S_MAX_RANK];
  const int r = H5_CHECK(H5Sget_simple_extent_dims(space, dims, nullptr));
  std::string shape = "[";
  for (int i = 0; i < r; ++i) shape += (i ? ", " : "") + std::to_string(dims[i]);
  rows.push_back({name, shape + "]", static_cast<std::int64_t>(H5Dget_storage_size(d)), raw});
}

// A bitdelta file's max_error/<state> (fp32 per block), or nothing when the state is exact.
std::vector<float> read_max_errors(hid_t file, const std::string& path, const char* state,
                                   std::size_t n_blocks) {
  const std::string name = std::string(detail::kMaxError) + "/" + state;
  if (!detail::exists(file, name)) return {};
  H5Context ctx(path, name);
  H5Id d(H5_CHECK(H5Dopen2(file, name.c_str(), H5P_DEFAULT)));
  H5Id space(H5_CHECK(H5Dget_space(d)));
  if (H5_CHECK(H5Sget_simple_extent_npoints(space)) != static_cast<hssize_t>(n_blocks))
    throw Error(ExitCode::data, "checkpoint " + path + ": dataset " + name + " has the wrong size");
  std::vector<float> out(n_blocks);
  H5_CHECK(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()));
  return out;
}

// Per tensor, the largest error of any of its blocks' decode (what the writer measured).
void print_error_bounds(hid_t file, const CheckpointMeta& m,
                        const std::vector<detail::TensorGeom>& geom, std::ostream& out) {
  std::vector<float> errors[3];
  for (int k = 0; k < 3; ++k)
    errors[k] = read_max_errors(file, m.path, detail::kStateGroups[k],
                                static_cast<std::size_t>(m.n_blocks));
  out << "  bitdelta: params " << m.bits.params << " bit(s) per value (delta to the anchor), "
      << "moments " << m.bits.moments << " bit(s)"
      << (m.bits.moments == 0 ? " (exact, xor)" : " (m linear, v log domain)") << ", groups of "
      << kQuantGroup << " values\n";
  out << "  error bounds, largest per tensor: |decoded - written| for params and adam_m, "
         "|decoded - written| / written for adam_v\n";
  char line[256];
  for (const detail::TensorGeom& g : geom) {
    std::string text;
    for (int k = 0; k < 3; ++k) {
      if (errors[k].empty()) continue;
      float worst = 0.0f;
      for (int i = 0; i < g.n_blocks; ++i)
        worst = std::max(worst, errors[k][static_cast<std::size_t>(g.first_block + i)]);
      std::snprintf(line, sizeof line, "  %s %.3g", detail::kStateGroups[k], worst);
      text += line;
    }
    std::snprintf(line, sizeof line, "    %-10s%s\n", g.name().c_str(), text.c_str());
    out << line;
  }
}

}  // namespace

std::string inspect(const std::string& path, bool* intact) {
  ensure_hdf5_ready();
  std::ostringstream out;
  const CheckpointMeta m = read_meta(path);
  const ParamCatalog catalog(m.shape);
  detail::BlockReader reader(path, catalog, nullptr);
  char line[256];
  out << "checkpoint " << path << "\n";
  out << "  format " << detail::kFormat << " v" << m.format_version << ", "
      << (m.complete ? "complete" : "INCOMPLETE (the write did not finish)") << "\n";
  out << "  step " << m.step << ", version " << m.version << ", tokens_seen " << m.tokens_seen
      << "\n";
  out << "  codec " << codec_name(m.codec);
  if (is_delta(m.codec)) out << ", anchor " << m.anchor << " (params_crc32c " << detail::hex32(m.anchor_crc32c) << ")";
  out << "\n  params_crc32c " << detail::hex32(m.params_crc32c) << "\n";
  out << "  model " << detail::shape_text(m.shape) << ", " << m.n_blocks << " blocks\n";

  std::vector<Row> rows;
  const auto geom = detail::tensor_geometry(catalog);
  // A state is stored exactly (fp32 or xor) or, in a bitdelta file, as codes plus scale pairs
  // (the codes stand for the state's fp32 bytes; the scales for none).
  for (const char* state : detail::kStateGroups)
    for (const auto& g : geom) {
      add_row(reader.file(), std::string(state) + "/" + g.name(), g.info->numel() * 4, rows);
      add_row(reader.file(), std::string(state) + detail::kCodesSuffix + "/" + g.name(),
              g.info->numel() * 4, rows);
      add_row(reader.file(), std::string(state) + detail::kScalesSuffix + "/" + g.name(), 0,
              rows);
    }
  for (const char* state : detail::kStateGroups)
    add_row(reader.file(), std::string(detail::kCrc) + "/" + state, m.n_blocks * 4, rows);
  std::snprintf(line, sizeof line, "  %-24s %-16s %12s %12s %7s\n", "dataset", "shape", "stored",
                "raw", "ratio");
  out << line;
  std::int64_t stored = 0, raw = 0;
  for (const Row& r : rows) {
    char ratio[16] = "      -";
    if (r.raw > 0 && r.stored > 0)
      std::snprintf(ratio, sizeof ratio, "%7.2f",
                    static_cast<double>(r.raw) / static_cast<double>(r.stored));
    std::snprintf(line, sizeof line, "  %-24s %-16s %12s %12s %s\n", r.name.c_str(),
                  r.shape.c_str(), human(static_cast<double>(r.stored)).c_str(),
                  human(static_cast<double>(r.raw)).c_str(), ratio);
    out << line;
    stored += r.stored;
    raw += r.raw;
  }
  std::error_code ec;
  const auto file_bytes = std::filesystem::file_size(path, ec);
  out << "  total stored " << human(static_cast<double>(stored)) << ", raw "
      << human(static_cast<double>(raw)) << ", file " << human(static_cast<double>(file_bytes))
      << "\n";
  if (m.codec == Codec::bitdelta) print_error_bounds(reader.file(), m, geom, out);

  // Decode every block (with the anchor for deltas) and check its CRCs.
  detail::Problems problems;
  std::size_t good = 0;
  try {
    std::vector<int> all(catalog.blocks().size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    good = detail::BlockReader(path, catalog, &problems).read(all).size();
  } catch (const Error& e) {
    problems.push_back(e.what());
  }
  if (intact) *intact = m.complete && problems.empty();
  if (problems.empty()) {
    out << "  crc32c: all " << good << " blocks verify (params, adam_m, adam_v)\n";
  } else {
    out << "  crc32c: " << (catalog.blocks().size() - good) << " of " << catalog.blocks().size()
        << " blocks DAMAGED or unverifiable:\n";
    for (std::size_t i = 0; i < problems.size() && i < 20; ++i) out << "    " << problems[i] << "\n";
    if (problems.size() > 20) out << "    ... and " << problems.size() - 20 << " more\n";
  }
  return out.str();
}

}  // namespace pdtrain::ckpt
