/* hearth: plans, runs and records sweeps of hearth-train runs.  The commands, their
 * options and help live in one table (cli.c); this only hands the command line over. */
#include "cli.h"

int main(int argc, char **argv)
{
    return hcli_main(argc, argv);
}
