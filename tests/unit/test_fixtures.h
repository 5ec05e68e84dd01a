/* tests/unit/test_fixtures.h — where the unit tests find the shared test
 * models ($DOLPHIN_SHARED, else ../shared beside the checkout), and the
 * skip of a cmocka test when they are absent (a clone on its own), on top of
 * tests/fixtures.h. Include after <cmocka.h>. */
#ifndef DOLPHIN_TEST_FIXTURES_H
#define DOLPHIN_TEST_FIXTURES_H

#include <stdio.h>
#include <stdlib.h>

#include "../fixtures.h"

/* The fixtures' root directory. */
static inline const char *test_shared_dir(void) { return fixture_shared_dir(); }

/* dir (n bytes) = the fixture model `name`; skips the calling test when
 * its config.json is not there. */
static inline void test_fixture_model(char *dir, size_t n, const char *name)
{
    snprintf(dir, n, "%s/models/%s", test_shared_dir(), name);
    char probe[1300];
    snprintf(probe, sizeof probe, "%s/config.json", dir);
    FILE *f = fopen(probe, "r");
    if (!f) {
        print_message("  note: %s not found (set DOLPHIN_SHARED); skipped\n", dir);
        skip();
    }
    fclose(f);
}

#endif
