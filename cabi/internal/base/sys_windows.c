/* Windows pieces of the C half of cabi; see sys_windows.h and
 * docs/PLATFORMS.md. */
#include <winsock2.h>
#include <ws2tcpip.h>
#include <windows.h>

#include <limits.h>
#include <string.h>

#include "sys_windows.h"

static SOCKET tcp_socket(void) {
    /* WSA_FLAG_NO_HANDLE_INHERIT: Windows' close-on-exec. */
    return WSASocketW(AF_INET, SOCK_STREAM, IPPROTO_TCP, NULL, 0, WSA_FLAG_NO_HANDLE_INHERIT);
}

static void close_if(SOCKET s) {
    if (s != INVALID_SOCKET) closesocket(s);
}

int la_win_stop_pair(int *rfd, int *wfd) {
    WSADATA wsa;
    if (WSAStartup(MAKEWORD(2, 2), &wsa) != 0) return -1;
    SOCKET l = tcp_socket(), c = INVALID_SOCKET, s = INVALID_SOCKET;
    struct sockaddr_in a, mine, peer;
    int alen = sizeof a, mlen = sizeof mine;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (l == INVALID_SOCKET || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 4) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &alen) != 0)
        goto fail;
    c = tcp_socket();
    if (c == INVALID_SOCKET || connect(c, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(c, (struct sockaddr *)&mine, &mlen) != 0)
        goto fail;
    /* Another local process may connect to the listener meanwhile: take
     * only the connection whose peer is our own socket. */
    for (int tries = 0; tries < 8 && s == INVALID_SOCKET; tries++) {
        int plen = sizeof peer;
        s = accept(l, (struct sockaddr *)&peer, &plen);
        if (s == INVALID_SOCKET) goto fail;
        if (peer.sin_port != mine.sin_port || peer.sin_addr.s_addr != mine.sin_addr.s_addr) {
            closesocket(s);
            s = INVALID_SOCKET;
        }
    }
    if (s == INVALID_SOCKET) goto fail;
    closesocket(l);
    l = INVALID_SOCKET;
    SetHandleInformation((HANDLE)s, HANDLE_FLAG_INHERIT, 0);
    u_long on = 1;
    ioctlsocket(s, FIONBIO, &on);
    ioctlsocket(c, FIONBIO, &on);
    if ((uintptr_t)s > INT_MAX || (uintptr_t)c > INT_MAX) goto fail;
    *rfd = (int)s;
    *wfd = (int)c;
    return 0;
fail:
    close_if(l);
    close_if(c);
    close_if(s);
    WSACleanup();
    return -1;
}

int la_win_stop_signal(int wfd) {
    char b = 's';
    return send((SOCKET)(uintptr_t)wfd, &b, 1, 0);
}

void la_win_stop_close(int rfd, int wfd) {
    closesocket((SOCKET)(uintptr_t)rfd);
    closesocket((SOCKET)(uintptr_t)wfd);
    WSACleanup();
}

size_t la_win_page_size(void) {
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    return si.dwPageSize;
}

void la_win_ring(int iocp) {
    /* 2 is keyRing in port/iocp_windows.go. A packet beyond the one Go
     * coalesces costs the waiter one more empty turn, nothing else. */
    PostQueuedCompletionStatus((HANDLE)(uintptr_t)(uint32_t)iocp, 0, 2, NULL);
}
