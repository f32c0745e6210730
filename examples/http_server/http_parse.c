/*
 * http_parse.c — the request parser and fixed responses (http_parse.h).
 *
 * Grammar (RFC 9112), as far as this server needs it:
 *   request-line = method SP request-target SP HTTP-version CRLF
 *   field-line   = field-name ":" OWS field-value OWS CRLF
 * Empty lines before the request line are skipped. A line ends at LF; a CR
 * is allowed only right before it.
 */
#define _POSIX_C_SOURCE 200809L
#include "http_parse.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* tchar: "!#$%&'*+-.^_`|~", digits and letters; one bit per ASCII code. */
#define B(c) (1ull << ((c)&63))
static const uint64_t tchar_lo = B('!') | B('#') | B('$') | B('%') | B('&') | B('\'') | B('*') | B('+') | B('-') |
                                 B('.') | (0x3ffull << 48) /* '0'..'9' */;
static const uint64_t tchar_hi = (0x3ffffffull << 1) /* 'A'..'Z' */ | B('^') | B('_') | B('`') |
                                 (0x3ffffffull << 33) /* 'a'..'z' */ | B('|') | B('~');
#undef B

static inline int is_tchar(unsigned char c)
{
    if (c < 64)
        return (int)((tchar_lo >> c) & 1);
    if (c < 128)
        return (int)((tchar_hi >> (c - 64)) & 1);
    return 0;
}

/* field-value bytes: HTAB, SP, VCHAR, obs-text. */
static inline int is_value_char(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

/* request-target bytes: anything visible (no SP, no control). */
static inline int is_target_char(unsigned char c) { return c > 0x20 && c != 0x7f; }

/* Returns the error result with req->status set. */
static int fail(http_request_t *req, int status)
{
    req->status = status;
    return HTTP_PARSE_ERROR;
}

/* The line starting at buf[pos]: *end is where its content ends (before CR
 * LF or LF), the result where the next line starts; 0 if no LF lies before
 * lim. */
static size_t line_at(const char *buf, size_t pos, size_t lim, size_t *end)
{
    const char *lf = memchr(buf + pos, '\n', lim - pos);
    if (!lf)
        return 0;
    size_t e = (size_t)(lf - buf);
    *end = (e > pos && buf[e - 1] == '\r') ? e - 1 : e;
    return e + 1;
}

/* method SP target SP "HTTP/" DIGIT "." DIGIT, in buf[pos..end). */
static int parse_request_line(const char *buf, size_t pos, size_t end, http_request_t *req)
{
    size_t i = pos;
    while (i < end && is_tchar((unsigned char)buf[i]))
        i++;
    if (i == pos || i >= end || buf[i] != ' ')
        return fail(req, 400);
    req->method_str = buf + pos;
    req->method_len = i - pos;
    if (req->method_len == 3 && memcmp(buf + pos, "GET", 3) == 0)
        req->method = HTTP_GET;
    else if (req->method_len == 4 && memcmp(buf + pos, "HEAD", 4) == 0)
        req->method = HTTP_HEAD;
    else if (req->method_len == 4 && memcmp(buf + pos, "POST", 4) == 0)
        req->method = HTTP_POST;
    else
        req->method = HTTP_OTHER;
    size_t t = ++i;
    while (i < end && is_target_char((unsigned char)buf[i]))
        i++;
    if (i == t || i >= end || buf[i] != ' ')
        return fail(req, 400);
    req->target = buf + t;
    req->target_len = i - t;
    const char *v = buf + i + 1;
    if (end - (i + 1) != 8 || memcmp(v, "HTTP/", 5) != 0 || v[6] != '.' || v[5] < '0' || v[5] > '9' || v[7] < '0' ||
        v[7] > '9')
        return fail(req, 400);
    if (v[5] != '1' || (v[7] != '0' && v[7] != '1'))
        return fail(req, 505);
    req->minor = v[7] - '0';
    req->keep_alive = req->minor == 1;
    return HTTP_PARSE_COMPLETE;
}

/* Content-Length: 1*DIGIT. A second one must say the same. */
static int parse_content_length(const char *v, size_t n, const http_limits_t *lim, int *seen, http_request_t *req)
{
    if (n == 0)
        return fail(req, 400);
    uint64_t x = 0;
    /* Past max_body or UINT64_MAX, x stops growing: the answer is 413 unless a non-digit follows. */
    int too_big = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return fail(req, 400);
        uint64_t d = (uint64_t)(v[i] - '0');
        if (too_big || x > lim->max_body || x > (UINT64_MAX - d) / 10) {
            too_big = 1;
            continue;
        }
        x = x * 10 + d;
    }
    if (too_big || x > lim->max_body)
        return fail(req, 413);
    if (*seen && x != req->content_length)
        return fail(req, 400);
    *seen = 1;
    req->content_length = x;
    return HTTP_PARSE_COMPLETE;
}

/* Connection: a comma-separated list of options; "close" and "keep-alive" count. */
static void parse_connection(const char *v, size_t n, http_request_t *req)
{
    size_t i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t s = i;
        while (i < n && v[i] != ',' && v[i] != ' ' && v[i] != '\t')
            i++;
        if (i - s == 5 && strncasecmp(v + s, "close", 5) == 0)
            req->keep_alive = 0;
        else if (i - s == 10 && strncasecmp(v + s, "keep-alive", 10) == 0 && req->minor == 0)
            req->keep_alive = 1;
    }
}

/* One field line in buf[pos..end); *hosts counts Host headers. */
static int parse_field(const char *buf, size_t pos, size_t end, const http_limits_t *lim, int *cl_seen, int *hosts,
                       http_request_t *req)
{
    size_t i = pos;
    while (i < end && is_tchar((unsigned char)buf[i]))
        i++;
    if (i == pos || i >= end || buf[i] != ':') /* no name, or whitespace before the colon */
        return fail(req, 400);
    size_t name_len = i - pos;
    i++;
    while (i < end && (buf[i] == ' ' || buf[i] == '\t'))
        i++;
    size_t vs = i;
    for (; i < end; i++)
        if (!is_value_char((unsigned char)buf[i]))
            return fail(req, 400);
    size_t ve = end;
    while (ve > vs && (buf[ve - 1] == ' ' || buf[ve - 1] == '\t'))
        ve--;
    const char *name = buf + pos, *v = buf + vs;
    size_t n = ve - vs;
    switch (name_len) {
    case 4:
        if (strncasecmp(name, "host", 4) == 0)
            (*hosts)++;
        break;
    case 10:
        if (strncasecmp(name, "connection", 10) == 0)
            parse_connection(v, n, req);
        break;
    case 14:
        if (strncasecmp(name, "content-length", 14) == 0)
            return parse_content_length(v, n, lim, cl_seen, req);
        break;
    case 17:
        if (strncasecmp(name, "transfer-encoding", 17) == 0)
            return fail(req, 501);
        break;
    }
    return HTTP_PARSE_COMPLETE;
}

/* An incomplete head: an error once it reached the limit, else need more. */
static int incomplete(size_t len, size_t max_head, int in_request_line, http_request_t *req)
{
    if (len < max_head)
        return HTTP_PARSE_NEED_MORE;
    return fail(req, in_request_line ? 414 : 431);
}

int http_parse_request(const char *buf, size_t len, const http_limits_t *limits, http_request_t *req)
{
    http_limits_t lim = {HTTP_DEFAULT_MAX_HEAD, HTTP_DEFAULT_MAX_HEADERS, HTTP_DEFAULT_MAX_BODY};
    if (limits) {
        if (limits->max_head)
            lim.max_head = limits->max_head;
        if (limits->max_headers)
            lim.max_headers = limits->max_headers;
        if (limits->max_body)
            lim.max_body = limits->max_body;
    }
    memset(req, 0, sizeof *req);
    size_t scan = len < lim.max_head ? len : lim.max_head; /* bytes the head may use */
    size_t pos = 0, end, next;
    for (;;) { /* empty lines before the request line */
        if (pos == scan)
            return incomplete(len, lim.max_head, 1, req);
        if (buf[pos] == '\n') {
            pos++;
        } else if (buf[pos] == '\r') {
            if (pos + 1 == scan)
                return incomplete(len, lim.max_head, 1, req);
            if (buf[pos + 1] != '\n')
                return fail(req, 400);
            pos += 2;
        } else {
            break;
        }
    }
    if (!(next = line_at(buf, pos, scan, &end)))
        return incomplete(len, lim.max_head, 1, req);
    if (parse_request_line(buf, pos, end, req) != HTTP_PARSE_COMPLETE)
        return HTTP_PARSE_ERROR;
    int cl_seen = 0, hosts = 0;
    for (pos = next;; pos = next) {
        if (!(next = line_at(buf, pos, scan, &end)))
            return incomplete(len, lim.max_head, 0, req);
        if (end == pos)
            break; /* the empty line: end of the head */
        if (buf[pos] == ' ' || buf[pos] == '\t') /* obsolete line folding */
            return fail(req, 400);
        if (++req->nheaders > lim.max_headers)
            return fail(req, 431);
        if (parse_field(buf, pos, end, &lim, &cl_seen, &hosts, req) != HTTP_PARSE_COMPLETE)
            return HTTP_PARSE_ERROR;
    }
    if (req->minor == 1 && hosts != 1)
        return fail(req, 400);
    if (hosts > 1)
        return fail(req, 400);
    req->head_len = next;
    return HTTP_PARSE_COMPLETE;
}

const char *http_reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

static void put2(char *p, int v)
{
    p[0] = (char)('0' + v / 10 % 10);
    p[1] = (char)('0' + v % 10);
}

void http_date(char out[30], time_t t)
{
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    struct tm tm;
    gmtime_r(&t, &tm);
    int year = tm.tm_year + 1900;
    memcpy(out, "Thu, 01 Jan 1970 00:00:00 GMT", 30);
    memcpy(out, days[tm.tm_wday % 7], 3);
    put2(out + 5, tm.tm_mday);
    memcpy(out + 8, months[tm.tm_mon % 12], 3);
    put2(out + 12, year / 100);
    put2(out + 14, year % 100);
    put2(out + 17, tm.tm_hour);
    put2(out + 20, tm.tm_min);
    put2(out + 23, tm.tm_sec);
}

/* The four 200 answers of one second (keep-alive or close, GET or HEAD),
 * per thread: rebuilt when the second changes. */
struct ok_cache {
    time_t sec;
    int built;
    size_t len[2][2];
    char bytes[2][2][HTTP_OK_MAX];
};

static _Thread_local struct ok_cache ok_cache;

static void ok_cache_build(struct ok_cache *c, time_t now)
{
    char date[30];
    http_date(date, now);
    for (int ka = 0; ka < 2; ka++)
        for (int head = 0; head < 2; head++) {
            int n = snprintf(c->bytes[ka][head], sizeof c->bytes[ka][head],
                             "HTTP/1.1 200 OK\r\nServer: libasync\r\nDate: %s\r\nContent-Type: text/plain\r\n"
                             "Content-Length: %zu\r\nConnection: %s\r\n\r\n%s",
                             date, sizeof HTTP_OK_BODY - 1, ka ? "keep-alive" : "close", head ? "" : HTTP_OK_BODY);
            c->len[ka][head] = (size_t)n;
        }
    c->sec = now;
    c->built = 1;
}

const char *http_ok_response(time_t now, int keep_alive, int head_only, size_t *len)
{
    struct ok_cache *c = &ok_cache;
    if (!c->built || c->sec != now)
        ok_cache_build(c, now);
    int ka = keep_alive != 0, head = head_only != 0;
    *len = c->len[ka][head];
    return c->bytes[ka][head];
}

size_t http_error_response(char *out, size_t cap, int status, time_t now)
{
    char date[30];
    http_date(date, now);
    const char *reason = http_reason(status);
    int body = snprintf(NULL, 0, "%d %s\n", status, reason);
    int n = snprintf(out, cap,
                     "HTTP/1.1 %d %s\r\nServer: libasync\r\nDate: %s\r\nContent-Type: text/plain\r\n"
                     "Content-Length: %d\r\nConnection: close\r\n\r\n%d %s\n",
                     status, reason, date, body, status, reason);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}
