/* stagepar.h - the model_par (model/model_par.h) of one rank of a decoder pipeline, for
 * the unit tests that build the ranks of a layout by hand.
 * No cmocka dependency (the bench links the support files too). */
#ifndef HEARTH_STAGEPAR_H
#define HEARTH_STAGEPAR_H

#include "comm/comm.h"
#include "model/model_par.h"

/* Stage s of pp holding decoder layers [first_layer, first_layer + n_layers): tp and ep
 * groups (NULL: size 1), sequence parallel when sp, the embedding on the first stage and
 * the head on the last.  No encoder: the caller sets has_encoder and enc_tp. */
void stagepar_decoder(model_par *par, comm *tpc, comm *epc, int sp, int s, int pp,
                      int first_layer, int n_layers);

#endif
