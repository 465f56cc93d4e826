// The run's own store server and its client (launch/tcp_store.h): one bound address, a token
// on every connection.
//
// Wire format (integers little-endian; str = u32 length + bytes):
//   handshake  client: "ciuicKV1" u32 len token     server: u8 1 (accepted) or 0 (refused, closes)
//   request    u8 op, then   SET str key, str value          -> u8 0
//                            GET str key, i64 timeout_ms     -> u8 0 str value | u8 1 (timed out)
//                            ADD str key, i64 delta          -> i64 new value
//                            CHECK u32 n, n str              -> u8 all present
//                            WAIT u32 n, n str, i64 timeout  -> u8 0 | u8 1 (timed out)
//                            DELETE str key                  -> u8 existed
//                            NUMKEYS                         -> i64
// A timeout <= 0 waits forever. ADD keeps the value as decimal text (as c10d's TCPStore does).
#include <arpa/inet.h>
#include <c10/util/Exception.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "launch/tcp_store.h"

namespace ciuic::launch {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[8] = {'c', 'i', 'u', 'i', 'c', 'K', 'V', '1'};
constexpr uint32_t kMaxToken = 1024;
constexpr uint32_t kMaxKey = 64 * 1024;
constexpr uint32_t kMaxValue = 256u * 1024 * 1024;
constexpr uint32_t kMaxKeys = 1 << 20;
constexpr auto kHandshakeLimit = std::chrono::seconds(5);
constexpr int kLoggedRefusals = 20;
enum Op : uint8_t { kSet = 1, kGet, kAdd, kCheck, kWait, kDelete, kNumKeys };

void put_u32(std::string& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_i64(std::string& b, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}
void put_str(std::string& b, const std::string& s) {
  put_u32(b, static_cast<uint32_t>(s.size()));
  b += s;
}

// Reads from a byte buffer; `ok` turns false when the buffer ends first (the request is not
// complete yet) and stays false.
struct Reader {
  const std::string& b;
  size_t at = 0;
  bool ok = true;
  bool need(size_t n) { return ok = ok && b.size() - at >= n; }
  uint8_t u8() { return need(1) ? static_cast<uint8_t>(b[at++]) : 0; }
  uint32_t u32() {
    if (!need(4)) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
      v |= static_cast<uint32_t>(static_cast<uint8_t>(b[at + i])) << (8 * i);
    at += 4;
    return v;
  }
  int64_t i64() {
    if (!need(8)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(b[at + i])) << (8 * i);
    at += 8;
    return static_cast<int64_t>(v);
  }
  std::string str(size_t n) {
    if (!need(n)) return {};
    std::string s = b.substr(at, n);
    at += n;
    return s;
  }
};

// Constant time in the token's content (its length is not secret: 64 hex digits).
bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string seconds_text(std::chrono::milliseconds t) {
  char buf[32];
  snprintf(buf, sizeof buf, "%g s", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

std::string sockaddr_text(const sockaddr_storage& sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (sa.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "?";
}

bool is_loopback_peer(const sockaddr_storage& sa) {
  if (sa.ss_family == AF_INET)
    return ntohl(reinterpret_cast<const sockaddr_in*>(&sa)->sin_addr.s_addr) == INADDR_LOOPBACK;
  if (sa.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6*>(&sa)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127 && a.s6_addr[13] == 0 &&
           a.s6_addr[14] == 0 && a.s6_addr[15] == 1;
  }
  return false;
}

}  // namespace

// ---- server ---------------------------------------------------------------------------------

class StoreServer::Impl {
 public:
  Impl(StoreServer& owner, int listen_fd, std::string token, bool loopback_only)
      : owner_(owner), listen_(listen_fd), token_(std::move(token)), loopback_only_(loopback_only) {
    if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error(std::string("store: pipe2 failed: ") + strerror(errno));
  }
  ~Impl() {
    for (auto& c : conns_) close(c.fd);
    close(listen_);
    close(wake_[0]);
    close(wake_[1]);
  }
  void stop() {
    stopping_ = true;
    const char b = 0;
    (void)!write(wake_[1], &b, 1);
  }

  void run() {
    while (!stopping_) {
      std::vector<pollfd> fds;
      fds.push_back({listen_, POLLIN, 0});
      fds.push_back({wake_[0], POLLIN, 0});
      for (auto& c : conns_)
        fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      const int n = poll(fds.data(), fds.size(), poll_timeout_ms());
      if (n < 0 && errno != EINTR) {
        log_error(std::string("store: poll failed: ") + strerror(errno));
        return;
      }
      if (stopping_) return;
      const size_t nconn = conns_.size();
      for (size_t i = 0; i < nconn && n > 0; ++i) {
        Conn& c = conns_[i];
        const short re = fds[i + 2].revents;
        if (re & (POLLIN | POLLHUP | POLLERR)) on_readable(c);
        if (!c.closing && (re & POLLOUT)) flush(c);
      }
      if (n > 0 && (fds[0].revents & POLLIN)) accept_all();
      expire(Clock::now());
      conns_.erase(std::remove_if(conns_.begin(), conns_.end(),
                                  [](const Conn& c) {
                                    if (c.closing) close(c.fd);
                                    return c.closing;
                                  }),
                   conns_.end());
    }
  }

 private:
  struct Wait {
    uint8_t op = 0;
    std::vector<std::string> keys;
    std::optional<Clock::time_point> deadline;
  };
  struct Conn {
    int fd = -1;
    std::string peer;
    bool authed = false;
    bool closing = false;
    Clock::time_point since;
    std::string in, out;
    std::optional<Wait> wait;
  };

  int poll_timeout_ms() const {
    std::optional<Clock::time_point> next;
    for (const auto& c : conns_) {
      if (!c.authed)
        next = std::min(next.value_or(c.since + kHandshakeLimit), c.since + kHandshakeLimit);
      if (c.wait && c.wait->deadline)
        next = std::min(next.value_or(*c.wait->deadline), *c.wait->deadline);
    }
    if (!next) return -1;
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(*next - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(ms + 1, 0, 60000));
  }

  void refuse(Conn& c, const std::string& why) {
    const int n = ++owner_.refused_;
    if (n <= kLoggedRefusals)
      log_warn("store at " + owner_.address() + ": refused a connection from " + c.peer + ": " +
               why);
    if (n == kLoggedRefusals)
      log_warn("store at " + owner_.address() + ": further refused connections are not logged");
    if (c.authed || c.in.size() >= sizeof kMagic) {
      const char no = 0;
      (void)!send(c.fd, &no, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    c.closing = true;
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage sa{};
      socklen_t len = sizeof sa;
      const int fd =
          accept4(listen_, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;  // EAGAIN, or out of descriptors: try again at the next poll
      Conn c;
      c.fd = fd;
      c.peer = sockaddr_text(sa);
      c.since = Clock::now();
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (loopback_only_ && !is_loopback_peer(sa)) {
        refuse(c, "the run has one node and its store serves only 127.0.0.1");
        close(fd);
        continue;
      }
      int pending = 0;
      for (const auto& o : conns_) pending += !o.authed;
      if (pending >= 256) {
        refuse(c, "too many connections without a handshake");
        close(fd);
        continue;
      }
      conns_.push_back(std::move(c));
    }
  }

  void expire(Clock::time_point now) {
    for (auto& c : conns_) {
      if (c.closing) continue;
      if (!c.authed && now >= c.since + kHandshakeLimit) {
        refuse(c, c.in.empty() ? "it sent no handshake within 5 s"
                               : "incomplete handshake within 5 s");
      } else if (c.wait && c.wait->deadline && now >= *c.wait->deadline) {
        c.wait.reset();
        reply(c, std::string(1, '\1'));
        parse(c);  // a client sends one request at a time; nothing should be waiting, but be exact
      }
    }
  }

  void on_readable(Conn& c) {
    char buf[65536];
    for (;;) {
      const ssize_t r = recv(c.fd, buf, sizeof buf, 0);
      if (r > 0) {
        c.in.append(buf, static_cast<size_t>(r));
        if (!c.authed && c.in.size() > sizeof kMagic + 4 + kMaxToken) break;
        continue;
      }
      if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        if (!c.authed)
          refuse(c, c.in.empty() ? "it closed the connection without a handshake"
                                 : "it closed the connection within the handshake");
        c.closing = true;
        return;
      }
      if (errno != EINTR) break;
    }
    parse(c);
  }

  // Serves the complete requests in c's buffer, then the waits that the changes completed.
  void parse(Conn& c) {
    while (!c.closing && !c.wait && step(c)) {
    }
    if (!changed_) return;
    changed_ = false;
    for (auto& o : conns_)
      if (o.wait && !o.closing) {
        try_finish(o);
        if (!o.wait) parse(o);
      }
  }

  // Serves one request (or the handshake); false when the buffer holds no complete one or the
  // connection is closing.
  bool step(Conn& c) {
    {
      Reader r{c.in};
      if (!c.authed) {
        const std::string magic = r.str(sizeof kMagic);
        if (r.ok && magic != std::string(kMagic, sizeof kMagic))
          return refuse(c,
                        "it does not speak the ciuic store protocol (a c10d client, a scanner?)"),
                 false;
        const uint32_t n = r.u32();
        if (r.ok && n > kMaxToken) return refuse(c, "its token is longer than any token"), false;
        const std::string tok = r.str(n);
        if (!r.ok) return false;
        if (!token_.empty() && !same_token(tok, token_))
          return refuse(c, tok.empty() ? "it sent no token" : "it sent a wrong token"), false;
        c.authed = true;
        c.in.erase(0, r.at);
        reply(c, std::string(1, '\1'));
        return true;
      }
      if (c.in.empty()) return false;
      const uint8_t op = r.u8();
      auto key = [&]() -> std::optional<std::string> {
        const uint32_t n = r.u32();
        if (r.ok && n > kMaxKey) {
          bad(c, "a key of " + std::to_string(n) + " bytes");
          return std::nullopt;
        }
        return r.str(n);
      };
      std::string out;
      switch (op) {
        case kSet: {
          auto k = key();
          if (!k) return false;
          const uint32_t n = r.u32();
          if (r.ok && n > kMaxValue)
            return bad(c, "a value of " + std::to_string(n) + " bytes"), false;
          std::string v = r.str(n);
          if (!r.ok) return false;
          data_[*k] = std::move(v);
          out.push_back(0);
          changed_ = true;
          break;
        }
        case kGet:
        case kWait: {
          Wait w;
          w.op = op;
          uint32_t n = 1;
          if (op == kWait) {
            n = r.u32();
            if (r.ok && n > kMaxKeys) return bad(c, std::to_string(n) + " keys in one wait"), false;
          }
          for (uint32_t i = 0; i < n && r.ok; ++i) {
            auto k = key();
            if (!k) return false;
            w.keys.push_back(std::move(*k));
          }
          const int64_t ms = r.i64();
          if (!r.ok) return false;
          if (ms > 0) w.deadline = Clock::now() + std::chrono::milliseconds(ms);
          c.in.erase(0, r.at);
          c.wait = std::move(w);
          try_finish(c);
          return true;
        }
        case kAdd: {
          auto k = key();
          if (!k) return false;
          const int64_t d = r.i64();
          if (!r.ok) return false;
          auto it = data_.find(*k);
          const int64_t v =
              (it == data_.end() ? 0 : std::strtoll(it->second.c_str(), nullptr, 10)) + d;
          data_[*k] = std::to_string(v);
          put_i64(out, v);
          changed_ = true;
          break;
        }
        case kCheck: {
          const uint32_t n = r.u32();
          if (r.ok && n > kMaxKeys) return bad(c, std::to_string(n) + " keys in one check"), false;
          bool all = true;
          for (uint32_t i = 0; i < n && r.ok; ++i) {
            auto k = key();
            if (!k) return false;
            all = all && data_.count(*k);
          }
          if (!r.ok) return false;
          out.push_back(all ? 1 : 0);
          break;
        }
        case kDelete: {
          auto k = key();
          if (!k || !r.ok) return false;
          out.push_back(data_.erase(*k) ? 1 : 0);
          break;
        }
        case kNumKeys: put_i64(out, static_cast<int64_t>(data_.size())); break;
        default: return bad(c, "unknown request " + std::to_string(op)), false;
      }
      c.in.erase(0, r.at);
      reply(c, out);
      return true;
    }
  }

  void bad(Conn& c, const std::string& what) {
    log_warn("store at " + owner_.address() + ": closed the connection from " + c.peer +
             ": it sent " + what);
    c.closing = true;
  }

  void try_finish(Conn& c) {
    for (const auto& k : c.wait->keys)
      if (!data_.count(k)) return;
    std::string out(1, '\0');
    if (c.wait->op == kGet) put_str(out, data_[c.wait->keys[0]]);
    c.wait.reset();
    reply(c, out);
  }

  void reply(Conn& c, const std::string& bytes) {
    c.out += bytes;
    flush(c);
  }
  void flush(Conn& c) {
    while (!c.out.empty()) {
      const ssize_t w = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        c.out.erase(0, static_cast<size_t>(w));
        continue;
      }
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (w < 0 && errno == EINTR) continue;
      c.closing = true;
      return;
    }
  }

  StoreServer& owner_;
  int listen_;
  int wake_[2] = {-1, -1};
  std::string token_;
  bool loopback_only_;
  std::atomic<bool> stopping_{false};
  std::vector<Conn> conns_;  // deque semantics not needed: only the loop touches it
  std::map<std::string, std::string> data_;
  bool changed_ = false;
};

StoreServer::StoreServer(const std::string& bind_addr, int port, std::string token,
                         bool loopback_only) {
  const std::string where = bind_addr + ":" + std::to_string(port);
  if (port < 0 || port > 65535) throw UsageError("store: invalid port " + std::to_string(port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const int gai = getaddrinfo(bind_addr.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0)
    throw Error("cannot start the run's store at " + where + ": cannot resolve \"" + bind_addr +
                "\": " + gai_strerror(gai));
  int fd = -1;
  std::string last = "no address";
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
      last = strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0)
    throw Error("cannot start the run's store at " + where + ": " + last +
                (last == strerror(EADDRNOTAVAIL)
                     ? " (it is not an address of this host: --master-addr must name node 0)"
                 : port != 0 ? " — is the port in use? Choose another --master-port"
                             : ""));
  sockaddr_storage sa{};
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  address_ = sockaddr_text(sa);
  host_ = address_.substr(0, address_.rfind(':'));
  if (host_.size() > 2 && host_.front() == '[') host_ = host_.substr(1, host_.size() - 2);
  port_ = std::atoi(address_.substr(address_.rfind(':') + 1).c_str());
  impl_ = std::make_unique<Impl>(*this, fd, std::move(token), loopback_only);
  thread_ = std::thread([this] { impl_->run(); });
}

StoreServer::~StoreServer() {
  impl_->stop();
  thread_.join();
}

// ---- client ---------------------------------------------------------------------------------

namespace {

[[noreturn]] void network_error(const std::string& m) { C10_THROW_ERROR(DistNetworkError, m); }

class RunStoreClient final : public c10d::Store {
 public:
  RunStoreClient(std::string addr, int port, std::string token, std::chrono::milliseconds timeout,
                 std::string who, std::shared_ptr<void> keep,
                 const std::function<std::string()>& late_token = {})
      : c10d::Store(timeout),
        addr_(std::move(addr)),
        port_(port),
        token_(std::move(token)),
        who_(std::move(who)),
        keep_(std::move(keep)) {
    connect_(late_token);
  }
  ~RunStoreClient() override {
    if (fd_ >= 0) close(fd_);
  }

  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<RunStoreClient>(addr_, port_, token_, timeout_, who_, keep_);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    std::string b(1, static_cast<char>(kSet));
    put_str(b, key);
    put_str(b, std::string(value.begin(), value.end()));
    std::lock_guard<std::mutex> l(mu_);
    request(b, timeout_);
    read_n(1, timeout_);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    std::string b(1, static_cast<char>(kGet));
    put_str(b, key);
    put_i64(b, timeout_.count());
    std::lock_guard<std::mutex> l(mu_);
    request(b, timeout_);
    if (read_n(1, timeout_ * 2)[0] != 0) timed_out({key}, timeout_);
    const std::string v = read_n(u32(read_n(4, timeout_)), timeout_);
    return {v.begin(), v.end()};
  }
  int64_t add(const std::string& key, int64_t value) override {
    std::string b(1, static_cast<char>(kAdd));
    put_str(b, key);
    put_i64(b, value);
    std::lock_guard<std::mutex> l(mu_);
    request(b, timeout_);
    const std::string r = read_n(8, timeout_);
    Reader rd{r};
    return rd.i64();
  }
  bool deleteKey(const std::string& key) override {
    std::string b(1, static_cast<char>(kDelete));
    put_str(b, key);
    std::lock_guard<std::mutex> l(mu_);
    request(b, timeout_);
    return read_n(1, timeout_)[0] != 0;
  }
  bool check(const std::vector<std::string>& keys) override {
    std::string b(1, static_cast<char>(kCheck));
    put_u32(b, static_cast<uint32_t>(keys.size()));
    for (const auto& k : keys) put_str(b, k);
    std::lock_guard<std::mutex> l(mu_);
    request(b, timeout_);
    return read_n(1, timeout_)[0] != 0;
  }
  int64_t getNumKeys() override {
    std::string b(1, static_cast<char>(kNumKeys));
    std::lock_guard<std::mutex> l(mu_);
    request(b, timeout_);
    const std::string r = read_n(8, timeout_);
    Reader rd{r};
    return rd.i64();
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::string b(1, static_cast<char>(kWait));
    put_u32(b, static_cast<uint32_t>(keys.size()));
    for (const auto& k : keys) put_str(b, k);
    put_i64(b, timeout.count());
    std::lock_guard<std::mutex> l(mu_);
    request(b, timeout_);
    const auto limit = timeout.count() > 0 ? timeout + timeout_ : std::chrono::milliseconds(-1);
    if (read_n(1, limit)[0] != 0) timed_out(keys, timeout);
  }

 private:
  static uint32_t u32(const std::string& b) {
    Reader r{b};
    return r.u32();
  }
  std::string where() const { return addr_ + ":" + std::to_string(port_); }

  [[noreturn]] static void timed_out(const std::vector<std::string>& keys,
                                     std::chrono::milliseconds t) {
    std::string s;
    for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
    C10_THROW_ERROR(DistStoreError,
                    "wait timeout after " + std::to_string(t.count()) + "ms, keys: " + s);
  }

  void connect_(const std::function<std::string()>& late_token) {
    const auto deadline = Clock::now() + timeout_;
    std::string last = "nothing accepted a connection there";
    for (;;) {
      if (try_connect(deadline, last)) break;
      const auto now = Clock::now();
      if (now >= deadline)
        throw StoreUnreachable(who_ + " could not reach the run's store at " + where() +
                               " within " + seconds_text(timeout_) +
                               " (is the launcher of node 0, or rank 0, running, and are "
                               "MASTER_ADDR/MASTER_PORT right and reachable from this host?): " +
                               last);
      std::this_thread::sleep_for(
          std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - now));
    }
    if (late_token) {
      try {
        token_ = late_token();
      } catch (...) {
        close(fd_);
        fd_ = -1;
        throw;
      }
    }
    std::string hs(kMagic, sizeof kMagic);
    put_str(hs, token_);
    std::string ok;
    try {
      request(hs, timeout_);
      ok = read_n(1, timeout_);
    } catch (const c10::DistNetworkError&) {
      ok = std::string(1, '\0');  // closed at once: refused (an address the server does not serve)
    }
    if (ok[0] != 1) {
      close(fd_);
      fd_ = -1;
      throw StoreRefused("the run's store at " + where() + " refused " + who_ +
                         ": its token (CIUIC_STORE_TOKEN) is not the run's, or this host may not "
                         "connect (the server logs which)");
    }
  }

  bool try_connect(Clock::time_point deadline, std::string& last) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = getaddrinfo(addr_.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (gai != 0) {
      last = std::string("cannot resolve the address: ") + gai_strerror(gai);
      return false;
    }
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      const int s =
          socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
      if (s < 0) continue;
      int r = connect(s, ai->ai_addr, ai->ai_addrlen);
      if (r != 0 && errno == EINPROGRESS) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        pollfd p{s, POLLOUT, 0};
        int err = -1;
        socklen_t len = sizeof err;
        if (poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 1, 1000))) == 1 &&
            getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) == 0) {
          r = err == 0 ? 0 : -1;
          if (err) errno = err;
        } else {
          errno = ETIMEDOUT;
        }
      }
      if (r == 0) {
        const int one = 1;
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fd_ = s;
        freeaddrinfo(res);
        return true;
      }
      last = strerror(errno);
      close(s);
    }
    freeaddrinfo(res);
    return false;
  }

  // Waits for the socket; a negative limit waits forever.
  void await(short events, Clock::time_point deadline, bool forever, const char* doing) {
    for (;;) {
      int ms = -1;
      if (!forever) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0)
          network_error("the run's store at " + where() + " did not answer " + doing + " in time");
        ms = static_cast<int>(std::min<int64_t>(left, 60000));
      }
      pollfd p{fd_, events, 0};
      const int n = poll(&p, 1, ms);
      if (n > 0) return;
      if (n < 0 && errno != EINTR) network_error(std::string("poll: ") + strerror(errno));
    }
  }

  void request(const std::string& b, std::chrono::milliseconds limit) {
    if (fd_ < 0) network_error("the connection to the run's store at " + where() + " is closed");
    const auto deadline = Clock::now() + limit;
    size_t at = 0;
    while (at < b.size()) {
      const ssize_t w = send(fd_, b.data() + at, b.size() - at, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        at += static_cast<size_t>(w);
      } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        await(POLLOUT, deadline, false, "(sending)");
      } else if (w < 0 && errno != EINTR) {
        fail(errno == EPIPE || errno == ECONNRESET ? "Connection closed by peer" : strerror(errno));
      }
    }
  }

  std::string read_n(size_t n, std::chrono::milliseconds limit) {
    const bool forever = limit.count() < 0;
    const auto deadline = Clock::now() + (forever ? std::chrono::milliseconds(0) : limit);
    std::string out;
    out.reserve(std::min<size_t>(n, 1 << 20));
    char buf[65536];
    while (out.size() < n) {
      await(POLLIN, deadline, forever, "a request");
      const ssize_t r = recv(fd_, buf, std::min(sizeof buf, n - out.size()), MSG_DONTWAIT);
      if (r > 0) {
        out.append(buf, static_cast<size_t>(r));
      } else if (r == 0) {
        fail("Connection closed by peer");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        fail(errno == ECONNRESET ? "Connection reset by peer" : strerror(errno));
      }
    }
    return out;
  }

  [[noreturn]] void fail(const std::string& why) {
    close(fd_);
    fd_ = -1;
    network_error("the run's store at " + where() + ": " + why);
  }

  std::string addr_;
  int port_;
  std::string token_;
  std::string who_;
  std::shared_ptr<void> keep_;
  std::mutex mu_;
  int fd_ = -1;
};

}  // namespace

c10::intrusive_ptr<c10d::Store> connect_run_store(
    const std::string& addr, int port, const std::string& token, std::chrono::milliseconds timeout,
    const std::string& who, std::shared_ptr<void> keep, std::function<std::string()> late_token) {
  if (port <= 0 || port > 65535)
    throw UsageError(who + ": invalid store port " + std::to_string(port));
  return c10::make_intrusive<RunStoreClient>(addr, port, token, timeout, who, std::move(keep),
                                             late_token);
}

std::string new_store_token() {
  unsigned char raw[32];
  size_t got = 0;
  while (got < sizeof raw) {
    const ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw Error(std::string("cannot make the store's token: getrandom: ") + strerror(errno));
    got += static_cast<size_t>(r);
  }
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (unsigned char c : raw) t += {hex[c >> 4], hex[c & 15]};
  return t;
}

}  // namespace ciuic::launch
