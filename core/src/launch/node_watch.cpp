// NodeWatch and the launchers' shared helpers (launch/node_watch.h).
#include "launch/node_watch.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ciuic::launch::detail {
std::string seconds_text(Clock::duration d) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// A c10 error's first line (no "Exception raised from ..." and no backtrace).
std::string c10_first_line(const c10::Error& e) {
  std::string m = e.what_without_backtrace();
  if (auto nl = m.find('\n'); nl != std::string::npos) m.resize(nl);
  return m;
}

// "1, 3-5"
std::string node_list(const std::vector<int>& nodes) {
  std::string s;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j + 1 < nodes.size() && nodes[j + 1] == nodes[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(nodes[i]);
    if (j > i) s += "-" + std::to_string(nodes[j]);
    i = j + 1;
  }
  return s;
}

NodeWatch::NodeWatch(const LaunchOptions& o, c10::intrusive_ptr<c10d::Store> store,
                     std::string where)
    : o_(o), store_(std::move(store)), where_(std::move(where)), start_(Clock::now()) {
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(std::string("launcher: pipe2 failed: ") + strerror(errno));
  peers_.resize(o_.nnodes);
  const std::string me = host_name() + " pid " + std::to_string(getpid());
  call([&] {
    if (o_.node_rank != 0) {
      if (store_->check({"failed"}))
        throw Error("launcher of node " + std::to_string(o_.node_rank) +
                    ": the run was already stopped: " + text(store_->get("failed")));
    }
    store_->set(key("node/", o_.node_rank), bytes(me));
    store_->add(key("alive/", o_.node_rank), 1);  // answered: the set above is applied
  });
}

NodeWatch::~NodeWatch() {
  stop();
  close(wake_[0]);
  close(wake_[1]);
}

void NodeWatch::report(const std::string& message, bool secondary) {
  std::lock_guard<std::mutex> l(mu_);
  failing_ = true;
  if (report_ == message) return;
  report_ = message;
  report_secondary_ = secondary;
  report_written_ = false;
  if (!report_at_) report_at_ = Clock::now();
  cv_.notify_all();
}

void NodeWatch::set_failing() {
  std::lock_guard<std::mutex> l(mu_);
  failing_ = true;
}

NodeWatch::State NodeWatch::state() {
  std::lock_guard<std::mutex> l(mu_);
  return state_;
}

std::string NodeWatch::node0() {
  std::lock_guard<std::mutex> l(mu_);
  return node0_.empty() ? std::string("node 0") : "node 0 (" + node0_ + ")";
}

void NodeWatch::finish() {
  stop();
  try {
    store_->set(key("done/", o_.node_rank), bytes("1"));
    store_->check({key("done/", o_.node_rank)});  // applied before this launcher goes on
  } catch (const c10::Error&) {
    // The store is gone (node 0 ended or was lost): nobody waits for this node any more.
  }
}

void NodeWatch::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void NodeWatch::wake() {
  const unsigned char b = 0;
  (void)!write(wake_[1], &b, 1);
}

void NodeWatch::run() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    l.unlock();
    std::string error;
    try {
      tick();
    } catch (const std::exception& e) {
      error = e.what();
    }
    l.lock();
    if (!error.empty()) {
      state_.store_error = error;
      wake();
      return;  // the store is gone (it lives in node 0's launcher): nothing more to watch
    }
    cv_.wait_for(l, kHeartbeat, [&] { return stop_ || (!report_.empty() && !report_written_); });
  }
}

void NodeWatch::tick() {
  std::string report;
  bool secondary = false, failing = false, have_verdict = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!report_written_) report = report_;
    secondary = report_secondary_;
    failing = failing_;
    have_verdict = state_.verdict.has_value();
  }
  call([&] { store_->add(key("alive/", o_.node_rank), 1); });
  if (!report.empty()) {
    if (o_.node_rank != 0)
      call([&] {
        store_->set(key("report/", o_.node_rank), bytes((secondary ? "1\t" : "0\t") + report));
      });
    std::lock_guard<std::mutex> l(mu_);
    if (report_ == report) report_written_ = true;
  }
  if (o_.node_rank == 0) {
    watch_nodes(failing);
    return;
  }
  if (!have_node0_) {  // node 0 registers right after its store starts, maybe after we connected
    std::string who;
    call([&] {
      if (store_->check({"node/0"})) who = text(store_->get("node/0"));
    });
    if (!who.empty()) {
      std::lock_guard<std::mutex> l(mu_);
      node0_ = who;
      have_node0_ = true;
    }
  }
  if (have_verdict) return;
  bool there = false;
  call([&] { there = store_->check({"failed"}); });
  if (!there) return;
  Verdict v;
  call([&] {
    v.node = std::atoi(text(store_->get("failed_node")).c_str());
    v.message = text(store_->get("failed"));
  });
  std::lock_guard<std::mutex> l(mu_);
  state_.verdict = std::move(v);
  failing_ = true;
  wake();
}

std::string NodeWatch::name(int k) const {
  return "node " + std::to_string(k) + (peers_[k].who.empty() ? "" : " (" + peers_[k].who + ")");
}

void NodeWatch::watch_nodes(bool failing) {
  const auto now = Clock::now();
  std::string own_report;
  bool own_secondary = false;
  Clock::time_point own_at{};
  bool have_verdict;
  {
    std::lock_guard<std::mutex> l(mu_);
    own_report = report_;
    own_secondary = report_secondary_;
    if (report_at_) own_at = *report_at_;
    have_verdict = state_.verdict.has_value();
  }
  // The first failure report of the run, as seen here.
  std::optional<Clock::time_point> first;
  if (!own_report.empty()) first = own_at;
  for (int k = 1; k < o_.nnodes; ++k)
    if (!peers_[k].report.empty() && (!first || peers_[k].report_at < *first))
      first = peers_[k].report_at;
  failing = failing || first.has_value() || have_verdict;
  const auto lost_after = failing ? kLostAfterFailure : kLostAfter;

  std::vector<int> missing;
  std::vector<std::string> newly_lost;
  int pending = 0;
  for (int k = 1; k < o_.nnodes; ++k) {
    Peer& n = peers_[k];
    if (n.done || n.lost) continue;
    if (!n.joined) {
      bool there = false;
      call([&] { there = store_->check({key("node/", k)}); });
      if (!there) {
        missing.push_back(k);
        continue;
      }
      call([&] { n.who = text(store_->get(key("node/", k))); });
      n.joined = true;
      n.moved = now;
    }
    call([&] { n.done = store_->check({key("done/", k)}); });
    if (n.done) continue;
    if (!have_verdict && n.report.empty()) {
      bool there = false;
      call([&] { there = store_->check({key("report/", k)}); });
      if (there) {
        std::string r;
        call([&] { r = text(store_->get(key("report/", k))); });
        n.secondary = r.compare(0, 2, "1\t") == 0;
        n.report = r.size() > 2 ? r.substr(2) : r;
        n.report_at = now;
        if (!first || now < *first) first = now;
      }
    } else if (!have_verdict) {  // a node may name another worker later: keep the latest
      std::string r;
      call([&] { r = text(store_->get(key("report/", k))); });
      n.secondary = r.compare(0, 2, "1\t") == 0;
      n.report = r.size() > 2 ? r.substr(2) : r;
    }
    int64_t beat = 0;
    call([&] { beat = store_->add(key("alive/", k), 0); });
    if (beat != n.beat) {
      n.beat = beat;
      n.moved = now;
      n.still = 0;
    } else {
      ++n.still;
    }
    if (first) {
      if (n.beat_after_failure < 0)
        n.beat_after_failure = beat;
      else if (beat > n.beat_after_failure)
        n.alive_after_failure = true;
    }
    // Lost: no heartbeat for lost_after, seen by several reads (a watch thread here that
    // stalled for a while would see the counter moved on its next read).
    if (n.still >= 2 && now - n.moved >= lost_after) {
      n.lost = true;
      n.lost_why = name(k) + " was lost: its launcher sent no heartbeat for " +
                   seconds_text(now - n.moved) +
                   " (it was killed, or its host or the network failed)";
      newly_lost.push_back(n.lost_why);
      continue;
    }
    ++pending;
  }

  std::optional<Verdict> verdict;
  if (!have_verdict) {
    if (!missing.empty() && now - start_ >= o_.rendezvous_timeout) {
      const bool one = missing.size() == 1;
      const std::string which = node_list(missing);
      verdict =
          Verdict{-1, (one ? "node " : "nodes ") + which + " never joined: no launcher of " +
                          (one ? "node " : "nodes ") + which + " connected to the run's store at " +
                          where_ + " within " + seconds_text(o_.rendezvous_timeout) +
                          " ([cluster] timeout_s). Start every node with the same "
                          "--nnodes, --master-addr and --master-port"};
    } else if (!newly_lost.empty()) {
      std::string m = newly_lost.front();
      for (size_t i = 1; i < newly_lost.size(); ++i) m += "; also " + newly_lost[i];
      verdict = Verdict{-1, m};
    } else if (first) {
      // Every node that has not reported has been heard from since the first report: none of
      // them is lost. Name the first report that is not a consequence, else (after
      // kSecondaryWait) the first one.
      bool all_heard = true;
      for (int k = 1; k < o_.nnodes; ++k) {
        const Peer& n = peers_[k];
        if (n.joined && !n.done && !n.lost && n.report.empty() && !n.alive_after_failure)
          all_heard = false;
      }
      struct Cand {
        int node;
        const std::string* msg;
        bool secondary;
        Clock::time_point at;
      };
      std::vector<Cand> cands;
      if (!own_report.empty()) cands.push_back({0, &own_report, own_secondary, own_at});
      for (int k = 1; k < o_.nnodes; ++k)
        if (!peers_[k].report.empty())
          cands.push_back({k, &peers_[k].report, peers_[k].secondary, peers_[k].report_at});
      std::sort(cands.begin(), cands.end(),
                [](const Cand& a, const Cand& b) { return a.at < b.at; });
      const Cand* pick = nullptr;
      for (const auto& c : cands)
        if (!c.secondary) {
          pick = &c;
          break;
        }
      if (!pick && now - *first >= kSecondaryWait && !cands.empty()) pick = &cands.front();
      if (all_heard && pick)
        verdict =
            Verdict{pick->node, "node " + std::to_string(pick->node) + " failed: " + *pick->msg};
    }
    if (verdict) {
      call([&] {
        store_->set("failed_node", bytes(std::to_string(verdict->node)));
        store_->set("failed", bytes(verdict->message));
      });
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  const bool changed = verdict || state_.pending != pending || !newly_lost.empty();
  if (verdict) {
    state_.verdict = std::move(verdict);
    failing_ = true;
  } else {
    for (auto& m : newly_lost) state_.lost.push_back(std::move(m));
  }
  state_.pending = pending;
  if (changed) wake();
}

}  // namespace ciuic::launch::detail
