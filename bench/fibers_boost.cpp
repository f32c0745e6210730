// Fibers, Boost.Fiber peer: the yield, spawn and ping-pong benchmarks of
// bench/fibers_async.c on Boost.Fiber's default scheduler (round robin, one
// thread: the main thread runs every fiber). Stacks come from a
// pooled_fixedsize_stack (libasync pools its stacks too; Boost's default,
// fixedsize_stack, mallocs and frees a fresh stack per fiber, which costs tens
// of microseconds per spawn here).
//
// usage: fibers_boost yield    fibers yields_per_fiber   (boost::this_fiber::yield)
//        fibers_boost spawn    total batch               (fiber + join)
//        fibers_boost pingpong round_trips             (two unbuffered_channel<uint64_t>)
#include <boost/fiber/all.hpp>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static uint64_t now_ns() {
    return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

static long arg(int argc, char **argv, int i, long def) {
    if (i >= argc) return def;
    char *end = nullptr;
    long v = std::strtol(argv[i], &end, 10);
    if (end == argv[i] || *end || v <= 0) {
        std::fprintf(stderr, "bad argument %d: %s\n", i, argv[i]);
        std::exit(2);
    }
    return v;
}

static boost::fibers::pooled_fixedsize_stack pool(64 * 1024);

template <typename F> static boost::fibers::fiber make(F fn) {
    return boost::fibers::fiber(std::allocator_arg, pool, fn);
}

[[noreturn]] static void fail(const char *msg) {
    std::printf("ok=0 error=\"%s\"\n", msg);
    std::exit(1);
}

static void yield(long n, long per) {
    uint64_t first = 0, last = 0;
    long finished = 0, counted = 0;
    std::vector<boost::fibers::fiber> fs;
    for (long g = 0; g < n; g++)
        fs.push_back(make([&] {
            if (!first) first = now_ns();
            for (long i = 0; i < per; i++) boost::this_fiber::yield();
            counted += per;
            if (++finished == n) last = now_ns();
        }));
    for (auto &f : fs) f.join();
    if (counted != n * per) fail("yield count mismatch");
    double ns = (double)(last - first);
    std::printf("ok=1 fibers=%ld yields=%ld secs=%.4f ns_per_yield=%.2f\n", n, counted, ns / 1e9, ns / (double)counted);
}

static void spawn(long total, long batch) {
    long counted = 0;
    std::vector<boost::fibers::fiber> fs;
    fs.reserve((size_t)batch);
    uint64_t t0 = now_ns();
    for (long done = 0; done < total; done += batch) {
        long b = total - done < batch ? total - done : batch;
        for (long i = 0; i < b; i++) fs.push_back(make([&] { counted++; }));
        for (auto &f : fs) f.join();
        fs.clear();
    }
    double ns = (double)(now_ns() - t0);
    if (counted != total) fail("not every fiber ran");
    std::printf("ok=1 fibers=%ld batch=%ld secs=%.4f ns_per_fiber=%.1f\n", total, batch, ns / 1e9, ns / (double)total);
}

static void pingpong(long n) {
    boost::fibers::unbuffered_channel<uint64_t> a, b;
    bool bad = false;
    uint64_t t0 = 0, t1 = 0;
    boost::fibers::fiber pong = make([&] {
        for (long i = 0; i < n; i++) {
            uint64_t x;
            if (a.pop(x) != boost::fibers::channel_op_status::success) return;
            b.push(x + 1);
        }
    });
    boost::fibers::fiber ping = make([&] {
        t0 = now_ns();
        for (uint64_t i = 0; i < (uint64_t)n; i++) {
            uint64_t x = i;
            a.push(x);
            if (b.pop(x) != boost::fibers::channel_op_status::success || x != i + 1) {
                bad = true;
                a.close();
                return;
            }
        }
        t1 = now_ns();
    });
    ping.join();
    pong.join();
    if (bad) fail("a round trip came back wrong");
    double ns = (double)(t1 - t0);
    std::printf("ok=1 round_trips=%ld secs=%.4f ns_per_rt=%.1f\n", n, ns / 1e9, ns / (double)n);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: fibers_boost yield|spawn|pingpong ...\n");
        return 2;
    }
    if (!std::strcmp(argv[1], "yield"))
        yield(arg(argc, argv, 2, 2), arg(argc, argv, 3, 1000000));
    else if (!std::strcmp(argv[1], "spawn"))
        spawn(arg(argc, argv, 2, 200000), arg(argc, argv, 3, 100));
    else if (!std::strcmp(argv[1], "pingpong"))
        pingpong(arg(argc, argv, 2, 1000000));
    else {
        std::fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    return 0;
}
