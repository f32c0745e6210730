/* async_version_string: the library's version is the header's
 * ASYNC_VERSION_MAJOR.MINOR.PATCH. */
#include "check.h"

CASE(version)
{
    char want[64];
    const char *v = async_version_string();
    CHECK(v != NULL);
    snprintf(want, sizeof want, "%d.%d.%d", ASYNC_VERSION_MAJOR, ASYNC_VERSION_MINOR, ASYNC_VERSION_PATCH);
    if (strcmp(v, want) != 0)
        fprintf(stderr, "library version \"%s\", header \"%s\"\n", v, want);
    CHECK(strcmp(v, want) == 0);
    CHECK(strcmp(async_version_string(), want) == 0);
}

TEST_MAIN()
