#include "report/metrics_log.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <ciuic/error.h>
#include <ciuic/log.h>

#include "report/tensorboard.h"

namespace ciuic::report {

namespace {

std::string write_error(const std::string& path, int err) {
  return "cannot write metrics file " + path + ": " + std::strerror(err) +
         " ([log] metrics_file; free some space or point it to another file system)";
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
  if (path.empty()) return;
  f_ = std::fopen(path.c_str(), "a");
  if (!f_)
    throw Error("cannot open metrics file " + path + " for writing: " + std::strerror(errno) +
                " ([log] metrics_file)");
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);  // every record was flushed (or its failure thrown) by write()
}

void MetricsLog::enable_tensorboard(const std::string& dir) {
  tb_ = std::make_unique<TensorBoardWriter>(dir);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!error_.empty()) throw Error(error_);  // an earlier record was lost: so is this one
  if (tb_) {
    int64_t step = 0;
    auto scalars = tensorboard_scalars(record, &step);
    if (!scalars.empty()) tb_->add_scalars(step, scalars);
  }
  if (!f_) return;
  const std::string line = record.dump() + "\n";
  errno = 0;
  const bool ok =
      std::fwrite(line.data(), 1, line.size(), f_) == line.size() && std::fflush(f_) == 0;
  if (ok) return;
  const int err = errno != 0 ? errno : EIO;
  // The stream is unusable: close it now (its buffer cannot be written either) so that the
  // destructor does not try again, and stop the run.
  std::fclose(f_);
  f_ = nullptr;
  error_ = write_error(path_, err);
  throw Error(error_);
}

std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record,
                                                                int64_t* step) {
  std::vector<std::pair<std::string, double>> out;
  if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer())
    return out;
  *step = record["step"].get<int64_t>();
  const std::string event = record.value("event", "");
  std::string prefix;
  if (event.empty())
    prefix = "train/";
  else if (event == "eval")
    prefix = "eval/";
  else if (event == "exact_match")
    prefix = "exact_match/";
  else if (event == "rank" && record.contains("rank") && record["rank"].is_number_integer())
    prefix = "rank" + std::to_string(record["rank"].get<int64_t>()) + "/";
  else
    return out;
  for (auto it = record.begin(); it != record.end(); ++it) {
    const std::string& k = it.key();
    if (k == "step" || k == "event" || (event == "rank" && k == "rank")) continue;
    double v;
    if (it->is_number())
      v = it->get<double>();
    else if (it->is_boolean())
      v = it->get<bool>() ? 1.0 : 0.0;
    else
      continue;
    std::string name = k;
    if (event == "eval" && name.rfind("eval_", 0) == 0) name = name.substr(5);
    if (event == "exact_match" && name != "questions")
      name += "_" + record.value("when", std::string());
    out.emplace_back(prefix + name, v);
  }
  return out;
}

}  // namespace ciuic::report
