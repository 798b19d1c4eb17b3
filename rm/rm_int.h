/*
** rm_int.h — private to rm/: encoding an answer as the reward model's input and the batched
** forward that reads the score head. Include rm/rm.h from outside.
*/
#ifndef PRL_RM_INT_H
#define PRL_RM_INT_H

#include "rm/rm.h"

/* The chat prompt + {"assistant", answer} encoded by tok (<|bos|> ... <|eos|>), cut at the
** front to max_len tokens; *ids malloc'd (caller frees). */
prl_status rm__encode(const prl_tokenizer *tok, const prl_chat_message *prompt, size_t n_prompt,
                      const char *answer, int max_len, int32_t **ids, int *n);
/* Scores of B encoded chats in one forward without saved activations (right-padded). */
prl_status rm__forward(prl_model *m, int32_t *const *ids, const int *lens, int B, double *scores);

#endif /* PRL_RM_INT_H */
