#include "common/table/table_spec.h"

#include <cmath>
#include <cstdlib>
#include <set>
#include <string>

#include "common/base/numeric/rng.h"

namespace gradsync {
namespace {

constexpr uint64_t kRowInitStream = 0x7461626c65ULL;  // "table"

// 53 bits of `bits` as a double in [0, 1).
double UnitDouble(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

}  // namespace

Result<RowInit> ParseRowInit(const std::string& text) {
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  RowInit init;
  if (kind == "normal") {
    init.kind = RowInit::Kind::kNormal;
  } else if (kind == "uniform") {
    init.kind = RowInit::Kind::kUniform;
  } else if (kind == "zeros" && colon == std::string::npos) {
    init.kind = RowInit::Kind::kZeros;
    init.scale = 0.0f;
    return init;
  } else {
    return InvalidArgumentError("unknown row initialization '" + text +
                                "' (normal:STD | uniform:A | zeros)");
  }
  if (colon != std::string::npos) {
    const std::string number = text.substr(colon + 1);
    char* end = nullptr;
    const double scale = std::strtod(number.c_str(), &end);
    if (number.empty() || end != number.c_str() + number.size() || !std::isfinite(scale) ||
        scale < 0.0) {
      return InvalidArgumentError("row initialization '" + text +
                                  "': the scale must be a finite number >= 0");
    }
    init.scale = static_cast<float>(scale);
  }
  return init;
}

std::string RowInitName(const RowInit& init) {
  switch (init.kind) {
    case RowInit::Kind::kNormal:
      return "normal:" + std::to_string(init.scale);
    case RowInit::Kind::kUniform:
      return "uniform:" + std::to_string(init.scale);
    case RowInit::Kind::kZeros:
      return "zeros";
  }
  return "?";
}

Status ValidateTableSpec(const TableSpec& spec) {
  const std::string table = "table '" + spec.name + "'";
  if (spec.name.empty()) return InvalidArgumentError("a table needs a name");
  if (spec.dim < 1 || spec.dim > (1 << 16)) {
    return InvalidArgumentError(table + ": dim " + std::to_string(spec.dim) +
                                " is outside [1, 65536]");
  }
  if (!std::isfinite(spec.init.scale) || spec.init.scale < 0.0f) {
    return InvalidArgumentError(table + ": the initialization scale must be finite and >= 0");
  }
  if (spec.max_rows_per_shard < 1 || spec.max_rows_per_shard > kMaxTableRowsPerShard) {
    return InvalidArgumentError(table + ": the bound of " +
                                std::to_string(spec.max_rows_per_shard) +
                                " rows per shard is outside [1, 2^31]");
  }
  if (Status st = ValidateRowOptimizerOptions(spec.optimizer); !st.ok()) {
    return InvalidArgumentError(table + ": " + st.message());
  }
  return OkStatus();
}

Status ValidateTableSpecs(std::span<const TableSpec> specs) {
  if (specs.size() > kMaxTables) {
    return InvalidArgumentError("a job has at most " + std::to_string(kMaxTables) + " tables, not " +
                                std::to_string(specs.size()));
  }
  std::set<std::string> names;
  for (const TableSpec& t : specs) {
    RETURN_IF_ERROR(ValidateTableSpec(t));
    if (!names.insert(t.name).second) return InvalidArgumentError("two tables are named '" + t.name + "'");
  }
  return OkStatus();
}

int TableShardOf(uint64_t id, int num_shards) {
  // Lemire's multiply-shift range reduction of the top 32 bits of a well-mixed hash: no division,
  // and a bias below shards / 2^32.
  const uint64_t top = Rng::SplitMix64(id) >> 32;
  return static_cast<int>((top * static_cast<uint64_t>(num_shards)) >> 32);
}

void InitRow(const TableSpec& spec, uint64_t id, float* row) {
  const int dim = spec.dim;
  const float scale = spec.init.scale;
  switch (spec.init.kind) {
    case RowInit::Kind::kZeros:
      for (int j = 0; j < dim; ++j) row[j] = 0.0f;
      return;
    case RowInit::Kind::kUniform: {
      const uint64_t base = Rng::Derive(spec.init_seed, kRowInitStream, id);
      for (int j = 0; j < dim; ++j) {
        const double u = UnitDouble(Rng::SplitMix64(base + static_cast<uint64_t>(j)));
        row[j] = static_cast<float>((2.0 * u - 1.0) * scale);
      }
      return;
    }
    case RowInit::Kind::kNormal: {
      // Box-Muller on counter-based uniforms: element pair k of row `id` from draws 2k and 2k + 1,
      // so a row's value depends on nothing but (init_seed, id).
      const uint64_t base = Rng::Derive(spec.init_seed, kRowInitStream, id);
      for (int j = 0; j < dim; j += 2) {
        const uint64_t k = static_cast<uint64_t>(j);
        const double u1 = 1.0 - UnitDouble(Rng::SplitMix64(base + k));  // (0, 1]: log is finite
        const double u2 = UnitDouble(Rng::SplitMix64(base + k + 1));
        const double r = std::sqrt(-2.0 * std::log(u1));
        row[j] = static_cast<float>(r * std::cos(2.0 * M_PI * u2) * scale);
        if (j + 1 < dim) row[j + 1] = static_cast<float>(r * std::sin(2.0 * M_PI * u2) * scale);
      }
      return;
    }
  }
}

Status CheckTableIds(const TableSpec& spec, std::span<const uint64_t> ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (spec.num_ids != 0 && ids[i] >= spec.num_ids) {
      const auto as_signed = static_cast<int64_t>(ids[i]);
      return InvalidArgumentError("table '" + spec.name + "': id " +
                                  (as_signed < 0 ? std::to_string(as_signed) + " is negative"
                                                 : std::to_string(ids[i]) + " is outside [0, " +
                                                       std::to_string(spec.num_ids) + ")"));
    }
    if (i > 0 && ids[i] <= ids[i - 1]) {
      return InvalidArgumentError("table '" + spec.name + "': ids must be sorted and unique (id " +
                                  std::to_string(ids[i]) + " follows " +
                                  std::to_string(ids[i - 1]) + ")");
    }
  }
  return OkStatus();
}

}  // namespace gradsync
