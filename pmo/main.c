/* turnwatch-pmo: the PMO in the daemon shell (flags, configuration, loop: common/daemon_main.c). */
#include "pmo.h"

int main(int argc, char **argv)
{
    static TwPmo pmo;

    return tw_daemon_main(argc, argv, &pmo_ops, &pmo, &pmo.d);
}
