// What Validate's checks share (train_config.cc and the checks in rooms of their own, such as
// table_checks.cc): the Checker that collects errors in either naming, the traits of a run several
// checks depend on, and whether a field was set. Internal to common/config/.
#pragma once

#include <google/protobuf/message.h>

#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include "common/config/train_config.h"

namespace gradsync::config_checks {

// Collects errors; a message's {field} and {field=value} name a setting in the naming asked for:
// --field-name / --field-name=value (flags), field_name / field_name value (specs; the mode's
// value in upper case, as a spec writes it).
class Checker {
 public:
  Checker(Naming naming, std::vector<ConfigError>* out) : naming_(naming), out_(out) {}

  std::string R(std::string_view text) const {
    std::string s;
    size_t i = 0;
    while (i < text.size()) {
      const size_t open = text.find('{', i),
                   close = open == std::string_view::npos ? open : text.find('}', open);
      if (close == std::string_view::npos) {
        s.append(text.substr(i));
        break;
      }
      s.append(text.substr(i, open - i));
      const std::string_view ref = text.substr(open + 1, close - open - 1);
      const size_t eq = ref.find('=');
      const std::string_view field = ref.substr(0, eq);
      if (naming_ == Naming::kFlags) {
        s += FlagName(field);
        if (eq != std::string_view::npos) s += "=" + std::string(ref.substr(eq + 1));
      } else {
        s += field;
        if (eq != std::string_view::npos) {
          std::string value(ref.substr(eq + 1));
          if (field == "mode") {
            for (char& c : value)
              c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
          }
          s += " " + value;
        }
      }
      i = close + 1;
    }
    return s;
  }
  // `text` is rendered; `literal` (user data) is appended as it is.
  void Add(const char* field, std::string_view text, const std::string& literal = "") {
    out_->push_back({field, R(text) + literal});
  }

 private:
  Naming naming_;
  std::vector<ConfigError>* out_;
};

inline bool Has(const google::protobuf::Message& m, const char* field) {
  const auto* f = m.GetDescriptor()->FindFieldByName(field);
  return f && m.GetReflection()->HasField(m, f);
}

// What several of Validate's checks depend on: the kind of mode, the model and the device.
struct Traits {
  explicit Traits(const config::TrainConfig& c)
      : mode(c.mode()),
        ps(IsPsMode(mode)),
        allreduce(mode == config::ALLREDUCE),
        joins(JoinsJob(mode)),
        sparse_model(c.model() == "sparse_logreg"),
        table_model(c.model() == "dlrm"),
        keyed(sparse_model || table_model),
        cuda(c.device() == "cuda") {}
  config::Mode mode;
  // keyed: a model that reads rows by key from embedding tables (sparse_logreg, dlrm): what
  // applies to the dense models only is refused for both, by the same checks.
  bool ps, allreduce, joins, sparse_model, table_model, keyed, cuda;
};

}  // namespace gradsync::config_checks
