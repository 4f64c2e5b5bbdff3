/* main.c — the kvbatch command line: dispatches to one cli_* per command. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvbatch: under construction\n");
    return 2;
}
