/* The ds4 oracle: antirez/ds4's own server code, compiled as-is, answering
 * the questions our DeepSeek-V4 fixtures ask. serving.py builds it against a
 * ds4 checkout ($DS4_SRC, pinned commit in build_oracle.py) and drives it.
 *
 * ds4_server.c is included whole (with DS4_SERVER_TEST, as ds4's own unit
 * tests do); the few engine functions the exercised paths call are taken
 * verbatim from ds4.c by serving.py (think_shim.h). Everything else the
 * server links against (sessions, sampling, the KV store on disk) is never
 * reached by these modes and is left unresolved at link time.
 *
 * Modes (all inputs are files, all output goes to stdout):
 *   chat BODY CTX [ID DSML_FILE]...   parse_chat_request + render: the prompt
 *                                     text. Each ID/DSML pair is put in the
 *                                     tool memory first (exact replay).
 *   anthropic BODY CTX [ID DSML]...   the same through parse_anthropic_request.
 *   think BODY CTX API                the think mode a request resolves to
 *                                     (none|high|max); API is chat|anthropic.
 *   states TEXT                       dsml_decode_state_for_text (ds4's
 *                                     reference recognizer) on every prefix
 *                                     ending at a UTF-8 character boundary:
 *                                     one digit per character (0 outside,
 *                                     1 structural, 2 string body, 3 JSON
 *                                     structural, 4 JSON string).
 *   tracker TEXT                      the same from the incremental
 *                                     dsml_decode_tracker_update the decode
 *                                     loop uses, fed one character at a time
 *                                     except that a '<' always arrives with
 *                                     the character after it ('_' at those
 *                                     positions): fed a lone '<' at the end
 *                                     of a string body, the tracker steps
 *                                     past it and misses the closing tag.
 *   parse TEXT THINK                  parse_generated_message_ex: JSON with
 *                                     ok, content, reasoning, raw_dsml, calls.
 *   stream TEXT THINK                 the OpenAI chat SSE projection
 *                                     (openai_sse_stream_update) fed one UTF-8
 *                                     character at a time, then final: the SSE
 *                                     bytes it wrote. */

#define DS4_SERVER_TEST 1
#define main ds4_server_main
#include "ds4_server.c"
#undef main

#include <sys/socket.h>

#include "think_shim.h"

void ds4_tokenize_rendered_chat(ds4_engine *e, const char *text, ds4_tokens *out) {
    (void)e;
    (void)text;
    (void)out;
}

/* Tokenization is stubbed above, so a request never owns tokens. */
void ds4_tokens_free(ds4_tokens *t) {
    (void)t;
}

static char *slurp(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) die("cannot open input");
    buf b = {0};
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof(tmp), fp)) > 0) buf_append(&b, tmp, n);
    fclose(fp);
    return b.ptr ? buf_take(&b) : xstrdup("");
}

static void init_server(server *s) {
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->tool_mu, NULL);
}

static void remember_pairs(server *s, int argc, char **argv, int from) {
    for (int i = from; i + 1 < argc; i += 2) {
        char *dsml = slurp(argv[i + 1]);
        tool_memory_put(s, argv[i], dsml);
        free(dsml);
    }
}

static int render(int argc, char **argv, bool anthropic) {
    if (argc < 4) die("render: BODY CTX");
    server s;
    init_server(&s);
    remember_pairs(&s, argc, argv, 4);
    char *body = slurp(argv[2]);
    request r;
    char err[256] = {0};
    bool ok = anthropic ?
        parse_anthropic_request(NULL, &s, body, 1000, atoi(argv[3]), &r, err, sizeof(err)) :
        parse_chat_request(NULL, &s, body, 1000, atoi(argv[3]), &r, err, sizeof(err));
    if (!ok) {
        fprintf(stderr, "request refused: %s\n", err);
        return 2;
    }
    fputs(r.prompt_text, stdout);
    request_free(&r);
    free(body);
    return 0;
}

static int think(int argc, char **argv) {
    if (argc < 5) die("think: BODY CTX API");
    server s;
    init_server(&s);
    char *body = slurp(argv[2]);
    request r;
    char err[256] = {0};
    bool ok = !strcmp(argv[4], "anthropic") ?
        parse_anthropic_request(NULL, &s, body, 1000, atoi(argv[3]), &r, err, sizeof(err)) :
        parse_chat_request(NULL, &s, body, 1000, atoi(argv[3]), &r, err, sizeof(err));
    if (!ok) {
        fprintf(stderr, "request refused: %s\n", err);
        return 2;
    }
    fputs(ds4_think_mode_name(r.think_mode), stdout);
    request_free(&r);
    free(body);
    return 0;
}

static size_t next_char(const char *s, size_t i, size_t n) {
    size_t len = (size_t)utf8_expected_len((unsigned char)s[i]);
    return i + len <= n ? i + len : n;
}

static int states(char **argv, bool reference) {
    char *text = slurp(argv[2]);
    size_t n = strlen(text);
    dsml_decode_tracker dt;
    dsml_decode_tracker_init(&dt);
    /* ds4 keeps its generated text NUL-terminated at its current length
     * (buf_append); some of its scans rely on that, so the prefix is copied. */
    buf prefix = {0};
    for (size_t i = 0; i < n;) {
        size_t next = next_char(text, i, n);
        buf_append(&prefix, text + i, next - i);
        i = next;
        if (reference) {
            putchar('0' + (int)dsml_decode_state_for_text(prefix.ptr, prefix.len));
        } else if (prefix.ptr[prefix.len - 1] == '<' && i < n) {
            /* A token never ends with a lone '<' here: the piece goes on
             * with the next character (see the tracker mode above). */
            putchar('_');
        } else {
            dsml_decode_tracker_update(&dt, prefix.ptr, prefix.len);
            putchar('0' + (int)dt.decode);
        }
    }
    buf_free(&prefix);
    free(text);
    return 0;
}

static int parse(char **argv) {
    char *text = slurp(argv[2]);
    char *content = NULL, *reasoning = NULL;
    tool_calls calls = {0};
    bool ok = parse_generated_message_ex(text, atoi(argv[3]) != 0, &content, &reasoning, &calls);
    buf b = {0};
    buf_printf(&b, "{\"ok\":%s,\"content\":", ok ? "true" : "false");
    json_escape(&b, content ? content : "");
    buf_puts(&b, ",\"reasoning\":");
    if (reasoning) json_escape(&b, reasoning);
    else buf_puts(&b, "null");
    buf_puts(&b, ",\"raw_dsml\":");
    if (calls.raw_dsml) json_escape(&b, calls.raw_dsml);
    else buf_puts(&b, "null");
    buf_puts(&b, ",\"calls\":[");
    for (int i = 0; i < calls.len; i++) {
        if (i) buf_putc(&b, ',');
        buf_puts(&b, "{\"name\":");
        json_escape(&b, calls.v[i].name ? calls.v[i].name : "");
        buf_puts(&b, ",\"arguments\":");
        json_escape(&b, calls.v[i].arguments ? calls.v[i].arguments : "");
        buf_putc(&b, '}');
    }
    buf_puts(&b, "]}");
    fputs(b.ptr, stdout);
    buf_free(&b);
    tool_calls_free(&calls);
    free(content);
    free(reasoning);
    free(text);
    return 0;
}

static void drain(int fd) {
    char tmp[65536];
    ssize_t n;
    while ((n = recv(fd, tmp, sizeof(tmp), MSG_DONTWAIT)) > 0) fwrite(tmp, 1, (size_t)n, stdout);
}

static int stream(char **argv) {
    char *text = slurp(argv[2]);
    size_t n = strlen(text);
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) die("socketpair");
    server s;
    init_server(&s);
    request r;
    request_init(&r, REQ_CHAT, 1000);
    r.has_tools = true;
    r.think_mode = atoi(argv[3]) ? DS4_THINK_HIGH : DS4_THINK_NONE;
    openai_stream st;
    openai_stream_start(&r, &st);
    buf prefix = {0};
    buf_puts(&prefix, "");
    for (size_t i = 0; i < n;) {
        size_t next = next_char(text, i, n);
        buf_append(&prefix, text + i, next - i);
        i = next;
        if (!openai_sse_stream_update(fds[0], &s, &r, "id", &st, prefix.ptr, prefix.len, false)) {
            die("stream");
        }
        drain(fds[1]);
    }
    if (!openai_sse_stream_update(fds[0], &s, &r, "id", &st, prefix.ptr, prefix.len, true)) {
        die("stream");
    }
    buf_free(&prefix);
    drain(fds[1]);
    openai_tool_stream_free(&st.tool);
    request_free(&r);
    free(text);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) die("usage: ds4_oracle MODE ARGS...");
    if (!strcmp(argv[1], "chat")) return render(argc, argv, false);
    if (!strcmp(argv[1], "anthropic")) return render(argc, argv, true);
    if (!strcmp(argv[1], "think")) return think(argc, argv);
    if (!strcmp(argv[1], "states")) return states(argv, true);
    if (!strcmp(argv[1], "tracker")) return states(argv, false);
    if (!strcmp(argv[1], "parse") && argc >= 4) return parse(argv);
    if (!strcmp(argv[1], "stream") && argc >= 4) return stream(argv);
    die("unknown mode");
    return 1;
}
