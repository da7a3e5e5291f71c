/* stagepar.c - the model_par of one rank of a decoder pipeline (see stagepar.h). */
#include "stagepar.h"

#include <string.h>

void stagepar_decoder(model_par *par, comm *tpc, comm *epc, int sp, int s, int pp,
                      int first_layer, int n_layers)
{
    memset(par, 0, sizeof *par);
    par->has_decoder = 1;
    par->tp = tpc;
    par->sp = sp;
    par->ep = epc;
    par->first_layer = first_layer;
    par->n_layers = n_layers;
    par->has_embed = s == 0;
    par->has_head = s == pp - 1;
}
