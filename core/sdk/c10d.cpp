// c10d_store() (ciuic/c10d.h): the run's Store as a c10d::Store for comm plugins built on c10d.
#include <ciuic/c10d.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>
#include <ciuic/error.h>

namespace ciuic {

C10dBackedStore::~C10dBackedStore() = default;

namespace {

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

// c10d::Store over any ciuic::Store.
class StoreAdapter final : public c10d::Store {
 public:
  explicit StoreAdapter(std::shared_ptr<ciuic::Store> s)
      : c10d::Store(s->timeout()), s_(std::move(s)) {}

  c10::intrusive_ptr<c10d::Store> clone() override { return c10::make_intrusive<StoreAdapter>(s_); }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    s_->set(key, std::string(value.begin(), value.end()));
  }
  std::vector<uint8_t> get(const std::string& key) override {
    wait({key}, timeout_);
    std::string v = s_->get(key);
    return std::vector<uint8_t>(v.begin(), v.end());
  }
  int64_t add(const std::string& key, int64_t value) override { return s_->add(key, value); }
  bool deleteKey(const std::string&) override {
    C10_THROW_ERROR(NotImplementedError, "ciuic store adapter: deleteKey is not supported");
  }
  bool check(const std::vector<std::string>& keys) override {
    for (const auto& k : keys)
      if (!s_->check(k)) return false;
    return true;
  }
  int64_t getNumKeys() override {
    C10_THROW_ERROR(NotImplementedError, "ciuic store adapter: getNumKeys is not supported");
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    // Poll so that c10d's own timeout (which may differ from the store's) is honoured and reported
    // the way c10d callers expect (DistStoreError).
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(100);
    while (!check(keys)) {
      if (timeout != kNoTimeout && std::chrono::steady_clock::now() >= deadline)
        C10_THROW_ERROR(DistStoreError, "ciuic store: timed out after " +
                                            std::to_string(timeout.count()) +
                                            " ms waiting for key(s) " + join_keys(keys));
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(10000));
    }
  }

 private:
  std::shared_ptr<ciuic::Store> s_;
};

}  // namespace

c10::intrusive_ptr<c10d::Store> c10d_store(const std::shared_ptr<Store>& store) {
  if (!store) throw Error("c10d_store: the store is null");
  if (auto* backed = dynamic_cast<const C10dBackedStore*>(store.get())) return backed->c10d();
  return c10::make_intrusive<StoreAdapter>(store);
}

}  // namespace ciuic
