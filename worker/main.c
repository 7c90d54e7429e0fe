/* turnwatch-worker: the worker in the daemon shell (flags, configuration with its programs checked, loop:
 * common/daemon_main.c). */
#include "worker.h"

int main(int argc, char **argv)
{
    static TwWorker w;

    return tw_daemon_main(argc, argv, &wrk_ops, &w, &w.d);
}
