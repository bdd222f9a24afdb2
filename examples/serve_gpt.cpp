// serve_gpt: a GPT that train_gpt trained (--checkpoint FILE) or freshly
// initialised weights (--random), served over HTTP/1.1 with OpenAI's
// completions API, so that OpenAI's clients (the openai Python package,
// curl) talk to it (docs/inference.md, "Serving over HTTP"):
//
//   POST /v1/completions   prompt (a string or a list: one choice each), max_tokens, temperature
//                          (0: greedy), top_p, top_k, seed, stop, stream (server-sent events)
//   GET  /v1/models        the one model
//   GET  /health           {"status":"ok"}
//
//   serve_gpt (--checkpoint FILE | --random) [--layers L --width C --heads H --seq T --vocab V]
//             [--seed S] [--host ADDR] [--port P] [--max-batch N] [--block-size N] [--tp N] [--pp N]
//             [--prefill-tokens N] [--pool-blocks N [--prefetch K]]
//             [--draft FILE | --draft-random] [--draft-layers L --draft-width C --draft-heads H] [--gamma G]
//             [--cape [--cape-bins K@P,...,K]] [--glide]
//
// Threads: one io_context thread runs every connection (Boost.Beast on Asio
// coroutines); one engine thread owns the model and loom::infer::Batcher
// (serve_gpt_engine.hpp), so requests arriving from many connections join
// the continuous batch between two forwards. With a draft model the engine
// decodes speculatively (loom::infer::SpeculativeBatcher, docs/speculative.md):
// each step is a round in which the draft proposes --gamma tokens per request
// and the target checks them in one pass, so a streamed chunk may carry
// several tokens; greedy text is the target's own. --cape checks a tree of
// candidates per pass (infer/cape.hpp); its acceptance is greedy, so a
// request with temperature > 0 is answered 400. --glide makes the draft a
// GliDe draft (its cross-attention reads the target's KV cache; --draft FILE
// a gpt::save_glide_draft file; not with --tp). With --tp N the engine
// thread becomes N rank threads, each holding its Megatron shard and a KV
// cache of its heads (infer/tensor_parallel_gpt.hpp); rank 0 reads the queue
// and broadcasts each step's submits and cancels to the others, so every rank
// steps the same batch (serve_gpt_engine.hpp), and the text is --tp 1's.
// With --pp N it becomes N pipeline stages (infer/pipelined_batcher.hpp): stage
// 0 admits requests into groups that move through the stages one after
// another, and the text is again --pp 1's. Both: N stages of --tp rank threads,
// each a shard of its stage.
// SIGINT or SIGTERM: stop accepting, let the requests in flight finish, exit 0.
//
// Exit status: 0 after a signal, 2 for a bad flag, 1 for anything else (a
// missing checkpoint, a port in use).
#include "gpt_model_flags.hpp"
#include "serve_gpt_engine.hpp"
#include "serve_gpt_openai.hpp"

#include <loom/gpt/checkpoint.hpp>
#include <loom/gpt/model.hpp>
#include <loom/infer/cached_glide.hpp>
#include <loom/infer/cached_gpt.hpp>
#include <loom/infer/draft_engine.hpp>
#include <loom/infer/kv_cache.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/param_arena.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using asio::awaitable;
using asio::use_awaitable;
using tcp = asio::ip::tcp;
using serve_gpt::ApiError;

constexpr const char* usage =
    "usage: serve_gpt (--checkpoint FILE | --random) [flags]\n"
    "  --checkpoint FILE  a train_gpt --save checkpoint (one file, not a --sharded directory)\n"
    "  --random           freshly initialised weights (from --seed) instead of a checkpoint\n"
    "  --layers N --width N --heads N --seq N --vocab N\n"
    "                     the model's shape, as train_gpt's flags (defaults 4, 256, 4, 128, 256)\n"
    "  --seed S           --random's weights (default 1); a request's own seed samples its tokens\n"
    "  --host ADDR        the address to listen on (default 127.0.0.1)\n"
    "  --port P           the port, 0: any free one (default 8000); the line 'serve_gpt: listening on\n"
    "                     http://ADDR:PORT' says which\n"
    "  --max-batch N      requests (prompts) running at once; more wait for a slot (default 8)\n"
    "  --block-size N     positions per block of the paged KV cache (default 16)\n"
    "  --tp N             tensor-parallel on N rank threads, N dividing --heads (default 1: the whole model)\n"
    "  --pp N             pipeline-parallel in N stage threads, N dividing --layers (default 1: the whole model);\n"
    "                     with --tp, N stages of --tp threads each\n"
    "  --prefill-tokens N with --pp: the most prompt tokens a pipeline step admits, a longer prompt alone;\n"
    "                     spreads a wave of prefills over steps the stages overlap (default 0: no limit)\n";

constexpr const char* flag_list =
    "--checkpoint, --random, --layers, --width, --heads, --seq, --vocab, --seed, --host, --port, --max-batch, "
    "--block-size, --tp, --pp, --prefill-tokens, --pool-blocks, --prefetch, --draft, --draft-random, --draft-layers, --draft-width, "
    "--draft-heads, --gamma, --cape, --cape-bins, --glide, --help";

constexpr std::size_t body_limit = 1 << 20;  // bytes of a request body; more is answered 413
constexpr const char* model_name = "loom-gpt";

using gpt_flags::bad_flag;
using gpt_flags::FlagError;
using gpt_flags::whole;

struct Flags {
    gpt_flags::ModelFlags target;
    std::uint64_t seed = 1;
    asio::ip::address host = asio::ip::make_address_v4("127.0.0.1");
    std::uint16_t port = 8000;
    std::int64_t max_batch = 8;
    std::int64_t block_size = 16;
    std::int64_t tp = 1;  // rank threads the target is cut over
    std::int64_t pp = 1;  // pipeline stages (rank threads) the target's blocks are split over
    std::int64_t prefill_tokens = 0;  // the most prompt tokens a pipeline step admits (0: no limit)
    gpt_flags::DraftFlags draft;  // speculative decoding, when on()
    gpt_flags::PoolFlags pool;    // peer memory pooling of the target's last blocks
};

Flags parse(int argc, char** argv) {
    Flags f;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (flag == "--help" || flag == "-h") {
            std::fputs(usage, stdout);
            std::fputs(gpt_flags::PoolFlags::usage, stdout);
            std::fputs(gpt_flags::DraftFlags::usage, stdout);
            std::exit(0);
        }
        if (flag == "--random") {
            f.target.random = true;
            continue;
        }
        if (f.draft.take_switch(flag)) continue;
        const bool known = flag == "--checkpoint" || flag == "--layers" || flag == "--width" || flag == "--heads" ||
                           flag == "--seq" || flag == "--vocab" || flag == "--seed" || flag == "--host" ||
                           flag == "--port" || flag == "--max-batch" || flag == "--block-size" || flag == "--tp" ||
                           flag == "--pp" || flag == "--prefill-tokens" || flag == "--pool-blocks" ||
                           flag == "--prefetch" || flag == "--draft" ||
                           flag == "--draft-layers" || flag == "--draft-width" || flag == "--draft-heads" ||
                           flag == "--gamma" || flag == "--cape-bins";
        if (!known) bad_flag("unknown flag ", flag, "; flags are ", flag_list);
        if (i + 1 >= argc) bad_flag(flag, " needs a value (serve_gpt --help lists the flags)");
        const std::string value = argv[++i];
        if (f.target.take(flag, value) || f.draft.take(flag, value) || f.pool.take(flag, value)) continue;
        if (flag == "--seed") f.seed = static_cast<std::uint64_t>(whole(flag, value, 0, std::int64_t{1} << 62));
        else if (flag == "--port") f.port = static_cast<std::uint16_t>(whole(flag, value, 0, 65535, " (0: any free port)"));
        else if (flag == "--max-batch") f.max_batch = whole(flag, value, 1, 4096);
        else if (flag == "--block-size") f.block_size = whole(flag, value, 1, 1 << 20);
        else if (flag == "--tp") f.tp = whole(flag, value, 1, 64);
        else if (flag == "--pp") f.pp = whole(flag, value, 1, 64);
        else if (flag == "--prefill-tokens") f.prefill_tokens = whole(flag, value, 0, std::int64_t{1} << 30, " (0: no limit)");
        else {
            boost::system::error_code ec;
            f.host = asio::ip::make_address(value, ec);
            if (ec) bad_flag("--host ", value, " is not an IP address; give one such as 127.0.0.1, 0.0.0.0 or ::1");
        }
    }
    f.target.check();
    if (f.target.config.heads % f.tp != 0)
        bad_flag("--tp ", f.tp, " does not divide --heads ", f.target.config.heads, "; use ",
                 gpt_flags::divisors(f.target.config.heads));
    gpt_flags::check_serving(f.target.config, f.draft, f.block_size, f.tp, f.pp, f.prefill_tokens);
    f.pool.check(f.target.config, f.tp, f.pp);
    return f;
}

// What every connection shares; touched on the io_context's one thread only.
struct Server {
    Server(asio::io_context& io_, tcp::acceptor acceptor_, serve_gpt::Engine& engine_, const loom::gpt::Config& model_,
           bool greedy_only_)
        : io(io_), acceptor(std::move(acceptor_)), engine(engine_), model(model_), greedy_only(greedy_only_) {}
    asio::io_context& io;
    tcp::acceptor acceptor;
    serve_gpt::Engine& engine;
    const loom::gpt::Config& model;
    bool greedy_only = false;           // CaPE: sampled requests are refused
    std::int64_t started = std::time(nullptr);
    std::uint64_t completions = 0;      // for ids
    std::mt19937_64 seeds{std::random_device{}()};  // for requests that give no seed
    bool stopping = false;
    std::set<tcp::socket*> idle;        // connections waiting for a request: closed on a signal
};

// A job's pieces as the connection's coroutine sees them: the engine thread
// posts each one here and wakes the coroutine by cancelling the timer.
struct Inbox {
    explicit Inbox(asio::io_context& io) : timer(io) {}
    asio::steady_timer timer;
    std::deque<serve_gpt::Piece> pieces;
};

awaitable<serve_gpt::Piece> next_piece(Inbox& inbox) {
    while (inbox.pieces.empty()) {
        inbox.timer.expires_at(asio::steady_timer::time_point::max());
        boost::system::error_code ec;  // operation_aborted: a piece came
        co_await inbox.timer.async_wait(asio::redirect_error(use_awaitable, ec));
    }
    serve_gpt::Piece piece = std::move(inbox.pieces.front());
    inbox.pieces.pop_front();
    co_return piece;
}

using Request = http::request<http::string_body>;

awaitable<void> send(tcp::socket& socket, const Request& req, http::status status, std::string body,
                     std::string_view content_type = "application/json", std::string_view allow = "") {
    http::response<http::string_body> res{status, req.version()};
    res.set(http::field::server, "loom serve_gpt");
    res.set(http::field::content_type, content_type);
    if (!allow.empty()) res.set(http::field::allow, allow);
    res.keep_alive(req.keep_alive());
    res.body() = std::move(body);
    res.prepare_payload();
    co_await http::async_write(socket, res, use_awaitable);
}

awaitable<void> send_error(tcp::socket& socket, const Request& req, const ApiError& e, std::string_view allow = "") {
    co_await send(socket, req, static_cast<http::status>(e.status), serve_gpt::error_json(e), "application/json",
                  allow);
}

// POST /v1/completions, once its body is read.
awaitable<void> complete(Server& server, tcp::socket& socket, const Request& req) {
    serve_gpt::Completion c;
    std::optional<ApiError> refused;  // answered outside the handler: no co_await may sit in one
    try {
        c = serve_gpt::parse_completion(req.body(), server.model, model_name, server.seeds());
        if (server.greedy_only && !c.sampling.greedy) {
            std::ostringstream temperature;
            temperature << c.sampling.temperature;
            throw ApiError(400, "temperature " + temperature.str() +
                                    " samples, but this server decodes with CaPE, whose tree acceptance is greedy "
                                    "only; send temperature 0",
                           "temperature");
        }
    } catch (const ApiError& e) {
        refused = e;
    }
    if (refused) {
        co_await send_error(socket, req, *refused);
        co_return;
    }
    const std::string id = "cmpl-" + std::to_string(++server.completions);
    const std::int64_t created = std::time(nullptr);
    auto inbox = std::make_shared<Inbox>(server.io);
    auto job = std::make_shared<serve_gpt::Job>();
    for (const auto& prompt : c.prompts)
        job->choices.push_back({.prompt = prompt, .max_new_tokens = c.max_tokens, .stop_tokens = {},
                                .sampling = c.sampling});
    job->stops = c.stops;
    job->deliver = [inbox, &io = server.io](serve_gpt::Piece piece) {
        asio::post(io, [inbox, piece = std::move(piece)]() mutable {
            inbox->pieces.push_back(std::move(piece));
            inbox->timer.cancel();
        });
    };
    // However this coroutine ends (a client gone mid-stream, a shutdown),
    // the job leaves the batch.
    struct CancelOnExit {
        serve_gpt::Engine& engine;
        std::shared_ptr<serve_gpt::Job> job;
        bool finished = false;
        ~CancelOnExit() {
            if (!finished) engine.cancel(job);
        }
    } guard{server.engine, job};
    server.engine.submit(job);

    std::vector<serve_gpt::Choice> choices(c.prompts.size());
    std::size_t open = choices.size();
    if (!c.stream) {
        while (open > 0) {
            serve_gpt::Piece p = co_await next_piece(*inbox);
            if (!p.error.empty()) {
                guard.finished = true;
                co_await send_error(socket, req, ApiError(500, "the engine failed: " + p.error, "", "server_error"));
                co_return;
            }
            serve_gpt::Choice& choice = choices[p.choice];
            choice.text.insert(choice.text.end(), p.text.begin(), p.text.end());
            choice.generated = p.generated;
            if (p.finish) {
                choice.finish = *p.finish;
                --open;
            }
        }
        guard.finished = true;
        co_await send(socket, req, http::status::ok, serve_gpt::completion_json(id, created, c, choices));
        co_return;
    }
    // Streamed: server-sent events in a chunked body, one per piece, then [DONE].
    http::response<http::empty_body> res{http::status::ok, req.version()};
    res.set(http::field::server, "loom serve_gpt");
    res.set(http::field::content_type, "text/event-stream");
    res.set(http::field::cache_control, "no-cache");
    res.keep_alive(req.keep_alive());
    res.chunked(true);
    http::response_serializer<http::empty_body> head{res};
    co_await http::async_write_header(socket, head, use_awaitable);
    while (open > 0) {
        serve_gpt::Piece p = co_await next_piece(*inbox);
        if (!p.error.empty()) break;  // the stream ends without [DONE]: the client sees it cut short
        if (p.finish) --open;
        const std::string event = serve_gpt::chunk_event(id, created, c.model, p.choice, p.text, p.finish);
        co_await asio::async_write(socket, http::make_chunk(asio::buffer(event)), use_awaitable);
    }
    guard.finished = true;
    if (open == 0) {
        const std::string done = "data: [DONE]\n\n";
        co_await asio::async_write(socket, http::make_chunk(asio::buffer(done)), use_awaitable);
    }
    co_await asio::async_write(socket, http::make_chunk_last(), use_awaitable);
}

// One request: routes it and answers.
awaitable<void> answer(Server& server, tcp::socket& socket, const Request& req) {
    std::string_view path = req.target();
    path = path.substr(0, path.find('?'));
    const auto method = [&](http::verb verb, const char* name) {
        return req.method() == verb
                   ? std::optional<ApiError>()
                   : ApiError(405, std::string(req.method_string()) + " " + std::string(path) + " is not served; use " +
                                       name + " " + std::string(path));
    };
    if (path == "/v1/completions") {
        if (auto e = method(http::verb::post, "POST")) co_await send_error(socket, req, *e, "POST");
        else co_await complete(server, socket, req);
    } else if (path == "/v1/models") {
        if (auto e = method(http::verb::get, "GET")) co_await send_error(socket, req, *e, "GET");
        else co_await send(socket, req, http::status::ok, serve_gpt::models_json(model_name, server.started));
    } else if (path == "/health") {
        if (auto e = method(http::verb::get, "GET")) co_await send_error(socket, req, *e, "GET");
        else co_await send(socket, req, http::status::ok, "{\"status\":\"ok\"}");
    } else {
        co_await send_error(socket, req,
                            ApiError(404, "no such path: " + std::string(path) +
                                              "; the server answers POST /v1/completions, GET /v1/models and GET "
                                              "/health"));
    }
}

// One connection: requests one after another while the client keeps it open.
awaitable<void> session(Server& server, tcp::socket socket) {
    boost::beast::flat_buffer buffer;
    try {
        for (;;) {
            http::request_parser<http::string_body> parser;
            parser.body_limit(body_limit);
            boost::system::error_code ec;
            server.idle.insert(&socket);
            co_await http::async_read_header(socket, buffer, parser, asio::redirect_error(use_awaitable, ec));
            server.idle.erase(&socket);
            // A client that asks before sending its body (curl does for large
            // ones) hears 100 Continue; a body over the limit was refused with
            // the header (body_limit), before the client sent it.
            if (!ec && !parser.is_done() && parser.get()[http::field::expect] == "100-continue") {
                http::response<http::empty_body> go_on{http::status::continue_, parser.get().version()};
                co_await http::async_write(socket, go_on, use_awaitable);
            }
            if (!ec && !parser.is_done())
                co_await http::async_read(socket, buffer, parser, asio::redirect_error(use_awaitable, ec));
            if (ec == http::error::body_limit) {
                Request req = parser.get();
                req.keep_alive(false);
                co_await send_error(socket, req,
                                    ApiError(413, "the request body is larger than the server's limit of " +
                                                      std::to_string(body_limit) + " bytes"));
                break;
            }
            const bool not_http = ec.category() == http::make_error_code(http::error::bad_method).category() &&
                                  ec != http::error::end_of_stream && ec != http::error::partial_message;
            if (not_http) {  // a request line or header Beast cannot read: say so, then close
                Request req;
                req.keep_alive(false);
                co_await send_error(socket, req, ApiError(400, "the request is not valid HTTP/1.1: " + ec.message()));
                break;
            }
            if (ec) break;  // the client closed, or a shutdown
            const Request& req = parser.get();
            co_await answer(server, socket, req);
            if (!req.keep_alive() || server.stopping) break;
        }
    } catch (const std::exception&) {
        // The client went away mid-answer: only this connection ends.
    }
    server.idle.erase(&socket);
    boost::system::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_send, ignored);
}

awaitable<void> accept(Server& server) {
    while (!server.stopping) {
        boost::system::error_code ec;
        tcp::socket socket = co_await server.acceptor.async_accept(asio::redirect_error(use_awaitable, ec));
        if (ec) {
            if (server.stopping) break;
            continue;  // e.g. too many open files: keep serving those already connected
        }
        asio::co_spawn(server.io, session(server, std::move(socket)), asio::detached);
    }
}

int run(const Flags& f) {
    std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error code, not the end of the server
    // Rank threads x GEMM threads (loom's and the BLAS's) within the cores: a
    // BLAS left at its default would run every rank thread's products on all of them.
    loom::kernels::host::set_blas_threads(loom::kernels::host::gemm_threads_for(static_cast<int>(f.tp * f.pp)));
    const loom::gpt::Config& config = f.target.config;
    loom::gpt::Model model = loom::gpt::make_model(config);
    loom::nn::ParamArena arena(model);
    gpt_flags::load_weights("serve_gpt: ", model, arena, config,
                            f.target.random ? std::string{} : f.target.checkpoint, f.seed);
    // The whole model's engine, unless the ranks serve it (each then holds its own shard and cache).
    std::optional<loom::infer::KvCache> cache;
    std::optional<loom::infer::CachedGpt> cached;
    gpt_flags::TargetWeights weights(f.pool, model, config, arena.values(), "serve_gpt: ");  // --pool-blocks
    if (f.tp == 1 && f.pp == 1) {
        cache.emplace(config.layers, config.width, f.max_batch, config.seq, f.block_size);
        cached.emplace(weights.model(), config, *cache);
        weights.install(*cached);
    }
    // The draft, when there is one: its own cache of the same slots and blocks (each rank's own with --tp).
    const gpt_flags::DraftModel drafts = gpt_flags::load_draft(f.draft, config, f.seed);
    std::optional<loom::infer::KvCache> draft_cache;
    std::optional<loom::infer::CachedGpt> draft_cached;
    std::optional<loom::infer::PlainDraft> plain_draft;
    std::optional<loom::infer::CachedGlide> glide_draft;
    loom::infer::DraftEngine* draft_engine = nullptr;
    if (f.draft.on() && f.tp == 1 && f.pp == 1) {
        const loom::gpt::Config& shape = f.draft.config;
        draft_cache.emplace(shape.layers, shape.width, f.max_batch, shape.seq, f.block_size);
        if (drafts.glide) {
            draft_engine = &glide_draft.emplace(*drafts.glide, shape, *draft_cache, *cache);
        } else {
            draft_cached.emplace(*drafts.plain, shape, *draft_cache);
            draft_engine = &plain_draft.emplace(*draft_cached);
        }
    }

    asio::io_context io(1);
    tcp::acceptor acceptor(io);
    try {
        const tcp::endpoint at(f.host, f.port);
        acceptor.open(at.protocol());
        acceptor.set_option(tcp::acceptor::reuse_address(true));
        acceptor.bind(at);
        acceptor.listen();
    } catch (const boost::system::system_error& e) {
        std::fprintf(stderr, "serve_gpt: cannot listen on %s port %u: %s\n", f.host.to_string().c_str(),
                     static_cast<unsigned>(f.port), e.code().message().c_str());
        return 1;
    }
    {
        std::optional<serve_gpt::Engine> engine_storage;
        if (f.pp > 1)
            engine_storage.emplace(serve_gpt::Engine::Pipeline{.config = &config, .whole = arena.values(),
                                                               .stages = static_cast<int>(f.pp),
                                                               .slots = f.max_batch, .block_size = f.block_size,
                                                               .tp = static_cast<int>(f.tp),
                                                               .prefill_tokens = f.prefill_tokens});
        else if (f.tp > 1)
            engine_storage.emplace(serve_gpt::Engine::TensorParallel{
                .config = &config, .whole = arena.values(), .ranks = static_cast<int>(f.tp),
                .slots = f.max_batch, .block_size = f.block_size, .draft = drafts.plain.get(),
                .draft_config = &f.draft.config, .gamma = f.draft.gamma, .cape = f.draft.cape});
        else if (draft_engine != nullptr) engine_storage.emplace(*cached, *draft_engine, f.draft.gamma, f.draft.cape);
        else engine_storage.emplace(*cached);
        serve_gpt::Engine& engine = *engine_storage;
        Server server(io, std::move(acceptor), engine, config, f.draft.cape.has_value());
        asio::signal_set signals(io, SIGINT, SIGTERM);
        signals.async_wait([&](const boost::system::error_code& ec, int signal) {
            if (ec) return;
            std::printf("serve_gpt: signal %d: no new connections; finishing the requests in flight\n", signal);
            std::fflush(stdout);
            server.stopping = true;
            boost::system::error_code ignored;
            server.acceptor.close(ignored);
            for (tcp::socket* idle : server.idle) idle->cancel(ignored);
        });
        asio::co_spawn(io, accept(server), asio::detached);
        const tcp::endpoint bound = server.acceptor.local_endpoint();
        const std::string host = bound.address().is_v6() ? "[" + bound.address().to_string() + "]"
                                                         : bound.address().to_string();
        const std::string speculative =
            f.draft.on() ? ", speculative decoding with gamma " + std::to_string(f.draft.gamma) : std::string{};
        std::string parallel;
        if (f.tp > 1) parallel += ", tensor-parallel on " + std::to_string(f.tp) + " rank threads";
        if (f.pp > 1)
            parallel += ", pipeline-parallel in " + std::to_string(f.pp) + " stages on rank threads" +
                        (f.tp > 1 ? " (" + std::to_string(f.tp * f.pp) + " in all)" : std::string{});
        std::printf("serve_gpt: up to %lld requests at once, KV cache in blocks of %lld positions%s%s\n"
                    "serve_gpt: listening on http://%s:%u\n",
                    static_cast<long long>(f.max_batch), static_cast<long long>(f.block_size), speculative.c_str(),
                    parallel.c_str(), host.c_str(), static_cast<unsigned>(bound.port()));
        std::fflush(stdout);
        io.run();  // returns once the acceptor is closed and every connection has ended
        engine.stop();
        const serve_gpt::Engine::Stats stats = engine.stats();
        if (!stats.speculative)
            std::printf("serve_gpt: stopped after %llu completions: %lld tokens in %lld forwards, at most %zu "
                        "requests in one forward\n",
                        static_cast<unsigned long long>(server.completions), static_cast<long long>(stats.tokens),
                        static_cast<long long>(stats.steps), stats.widest);
        else
            std::printf("serve_gpt: stopped after %llu completions: %lld tokens in %lld speculative rounds, at most "
                        "%zu requests in one round; %lld draft tokens proposed, %lld accepted (%.0f%%), %.2f tokens "
                        "per target pass\n",
                        static_cast<unsigned long long>(server.completions), static_cast<long long>(stats.tokens),
                        static_cast<long long>(stats.steps), stats.widest,
                        static_cast<long long>(stats.speculative->drafted),
                        static_cast<long long>(stats.speculative->accepted),
                        100.0 * stats.speculative->acceptance_rate(), stats.speculative->tokens_per_pass());
    }
    io.restart();
    io.poll();  // pieces the engine posted last: their inboxes are freed on this thread
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Flags flags;
    try {
        flags = parse(argc, argv);
    } catch (const FlagError& e) {
        std::fprintf(stderr, "serve_gpt: %s\n", e.what());
        return 2;
    }
    try {
        return run(flags);
    } catch (const loom::Error& e) {
        std::fprintf(stderr, "serve_gpt: %s\n", e.message().c_str());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "serve_gpt: %s\n", e.what());
        return 1;
    }
}
