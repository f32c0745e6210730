//go:build windows

/* The fiber poller on Windows (poller.h): an I/O completion port per
 * scheduler. The idle worker sleeps in GetQueuedCompletionStatusEx (timeout:
 * the next timer); la_poller_kick posts one coalesced packet (key LA_KEY_BELL)
 * to wake it. Socket waits are IOCTL_AFD_POLL requests on a \Device\Afd
 * handle bound to the port (key LA_KEY_AFD), the mechanism of
 * port/iocp_windows.go and wepoll, here one shot per parked wait: the
 * request's packet is the event. The runtime's IOCP backend is Go's; this
 * one is C because it runs per park (see docs/ARCHITECTURE.md). */
#include <winsock2.h>
#include <windows.h>
#include <winternl.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "poller.h"

#define LA_KEY_BELL 1
#define LA_KEY_AFD 2
#define LA_IOCTL_AFD_POLL 0x00012024

typedef NTSTATUS(NTAPI *nt_ioctl_fn)(HANDLE, HANDLE, PVOID, PVOID, PVOID, ULONG, PVOID, ULONG, PVOID, ULONG);
typedef NTSTATUS(NTAPI *nt_cancel_fn)(HANDLE, PVOID, PVOID);
typedef NTSTATUS(NTAPI *nt_create_fn)(PHANDLE, ACCESS_MASK, PVOID, PVOID, PLARGE_INTEGER, ULONG, ULONG, ULONG,
                                      ULONG, PVOID, ULONG);
static nt_ioctl_fn nt_ioctl;
static nt_cancel_fn nt_cancel;
static nt_create_fn nt_create;
static INIT_ONCE nt_once = INIT_ONCE_STATIC_INIT;

static BOOL CALLBACK nt_load(PINIT_ONCE o, PVOID a, PVOID *c) {
    (void)o, (void)a, (void)c;
    HMODULE nt = GetModuleHandleW(L"ntdll.dll");
    if (!nt) return TRUE;
    nt_ioctl = (nt_ioctl_fn)(void (*)(void))GetProcAddress(nt, "NtDeviceIoControlFile");
    nt_cancel = (nt_cancel_fn)(void (*)(void))GetProcAddress(nt, "NtCancelIoFileEx");
    nt_create = (nt_create_fn)(void (*)(void))GetProcAddress(nt, "NtCreateFile");
    return TRUE;
}

/* \Device\Afd\libasync, bound to the port; NULL on failure (errno set). */
static HANDLE afd_open(HANDLE port) {
    InitOnceExecuteOnce(&nt_once, nt_load, NULL, NULL);
    if (!nt_ioctl || !nt_cancel || !nt_create) {
        errno = ENOSYS;
        return NULL;
    }
    static const WCHAR name[] = L"\\Device\\Afd\\libasync";
    UNICODE_STRING us = {(USHORT)(sizeof name - sizeof(WCHAR)), (USHORT)sizeof name, (PWSTR)name};
    OBJECT_ATTRIBUTES oa;
    memset(&oa, 0, sizeof oa);
    oa.Length = sizeof oa;
    oa.ObjectName = &us;
    IO_STATUS_BLOCK iosb;
    HANDLE h = NULL;
    NTSTATUS st = nt_create(&h, SYNCHRONIZE, &oa, &iosb, NULL, 0, FILE_SHARE_READ | FILE_SHARE_WRITE,
                            1 /* FILE_OPEN */, 0, NULL, 0);
    if (st != 0) {
        errno = EIO;
        return NULL;
    }
    if (!CreateIoCompletionPort(h, port, LA_KEY_AFD, 0)) {
        CloseHandle(h);
        errno = EIO;
        return NULL;
    }
    SetFileCompletionNotificationModes(h, FILE_SKIP_SET_EVENT_ON_HANDLE);
    return h;
}

int la_poller_open(la_poller_t *p) {
    atomic_store(&p->kicked, 0);
    atomic_store(&p->nops, 0);
    p->afd = NULL;
    p->port = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 0);
    if (!p->port) {
        errno = ENOMEM;
        return -1;
    }
    /* The AFD handle comes with the first fd wait (afd_get): a scheduler that
     * never waits on a socket needs none. */
    return 0;
}

static void afd_done(la_afd_op_t *op) {
    if (atomic_fetch_sub(&op->refs, 1) == 1) free(op);
}

void la_afd_op_unref(la_afd_op_t *op) { afd_done(op); }

/* Takes what the port has (up to timeout_ms); fn may be NULL (close);
 * *rang (not NULL): whether it took the doorbell's packet. */
static int drain(la_poller_t *p, int timeout_ms, void (*fn)(void *, void *, unsigned), void *ctx, int *rang) {
    OVERLAPPED_ENTRY ents[64];
    ULONG n = 0;
    DWORD t = timeout_ms < 0 ? INFINITE : (DWORD)timeout_ms;
    if (rang) *rang = 0;
    if (!GetQueuedCompletionStatusEx(p->port, ents, 64, &n, t, FALSE)) return 0;
    int nfd = 0;
    for (ULONG i = 0; i < n; i++) {
        if (ents[i].lpCompletionKey == LA_KEY_BELL) {
            atomic_store(&p->kicked, 0);
            if (rang) *rang = 1;
            continue;
        }
        la_afd_op_t *op = (la_afd_op_t *)ents[i].lpOverlapped;
        if (!op) continue;
        atomic_fetch_sub(&p->nops, 1);
        NTSTATUS st = (NTSTATUS)(uint32_t)op->iosb.status;
        unsigned got = 0;
        if (st == 0 && op->info.nhandles >= 1) got = op->info.h.events;
        else if ((uint32_t)st >> 30 == 3 && st != (NTSTATUS)0xC0000120 /* STATUS_CANCELLED */)
            got = LA_AFD_LOCAL_CLOSE; /* the socket is unusable: let the waiter find out */
        if (fn) {
            fn(ctx, op, got);
            nfd++;
        }
        afd_done(op);
    }
    return nfd;
}

void la_poller_close(la_poller_t *p) {
    if (p->afd) {
        /* Closing the handle cancels its polls; their packets still come. */
        CloseHandle(p->afd);
        p->afd = NULL;
        for (int i = 0; i < 100 && atomic_load(&p->nops) > 0; i++) drain(p, 10, NULL, NULL, NULL);
        /* A request the kernel never returned keeps its memory (leaked
         * rather than freed under a late write). */
    }
    if (p->port) CloseHandle(p->port);
    p->port = NULL;
}

void la_poller_kick(la_poller_t *p) {
    if (!atomic_exchange(&p->kicked, 1)) PostQueuedCompletionStatus(p->port, 0, LA_KEY_BELL, NULL);
}

int la_poller_wait(la_poller_t *p, int timeout_ms, void (*fn)(void *ctx, void *rec, unsigned got), void *ctx,
                   int *rang) {
    return drain(p, timeout_ms, fn, ctx, rang);
}

static SRWLOCK afd_mu = SRWLOCK_INIT;

static HANDLE afd_get(la_poller_t *p) {
    HANDLE h = __atomic_load_n(&p->afd, __ATOMIC_ACQUIRE);
    if (h) return h;
    AcquireSRWLockExclusive(&afd_mu);
    if (!(h = p->afd)) {
        h = afd_open(p->port);
        __atomic_store_n(&p->afd, h, __ATOMIC_RELEASE);
    }
    ReleaseSRWLockExclusive(&afd_mu);
    return h;
}

int la_poller_afd_submit(la_poller_t *p, la_afd_op_t *op, uintptr_t base_socket, uint32_t afd_events) {
    HANDLE afd = afd_get(p);
    if (!afd) return ERROR_NOT_SUPPORTED;
    op->info.timeout = INT64_MAX;
    op->info.nhandles = 1;
    op->info.exclusive = 0;
    op->info.h.handle = base_socket;
    op->info.h.events = afd_events;
    op->info.h.status = 0;
    op->iosb.status = (uintptr_t)(uint32_t)STATUS_PENDING;
    op->iosb.information = 0;
    atomic_store(&op->refs, 2);
    atomic_fetch_add(&p->nops, 1);
    NTSTATUS st = nt_ioctl(afd, NULL, NULL, &op->iosb, &op->iosb, LA_IOCTL_AFD_POLL, &op->info, sizeof op->info,
                           &op->info, sizeof op->info);
    if (st != 0 && st != (NTSTATUS)STATUS_PENDING) {
        atomic_fetch_sub(&p->nops, 1);
        atomic_store(&op->refs, 1);
        return (int)st;
    }
    return 0;
}

void la_poller_afd_cancel(la_poller_t *p, la_afd_op_t *op) {
    IO_STATUS_BLOCK iosb;
    HANDLE afd = __atomic_load_n(&p->afd, __ATOMIC_ACQUIRE);
    if (afd) nt_cancel(afd, &op->iosb, &iosb);
}
