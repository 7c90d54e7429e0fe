/* runner.c — main() of every Check test executable: runs the suite whose constructor TW_SUITE_FN names, TAP
 * on stdout (meson `protocol: 'tap'`). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef TW_WITH_FIXTURE
#include "fixture.h"
#endif

#ifndef TW_SUITE_FN
#error "compile with -DTW_SUITE_FN=<name>_suite"
#endif

Suite *TW_SUITE_FN(void);

int main(void)
{
    /* Forked test children inherit our stdio buffers; line buffering means none of them holds half a TAP line
     * that it would print a second time when it exits. */
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifdef TW_WITH_FIXTURE
    /* Clusters left by an earlier run that was killed (pg_ctl detaches the postmaster from our process
     * group). */
    tw_fx_sweep_stale();
#endif
    SRunner *sr = srunner_create(TW_SUITE_FN());
    srunner_set_tap(sr, "-");
    srunner_run_all(sr, CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
#ifdef TW_WITH_FIXTURE
    /* Whatever a timed-out or crashed test child could not stop itself. */
    tw_fx_sweep_stale();
#endif
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
