/*
** tokenizer.h — prl's byte-level BPE tokenizer: train, encode (serial and multi-threaded),
** decode, chat encoding for SFT, and tokenizer.json save/load.
**
** Included by engine/engine.h after prl_status is declared; do not include it directly.
**
** Vocabulary layout (fixed; ids never move between versions of a file):
**   ids 0..15      special tokens (enum below; 12 named + 4 reserved spares),
**   ids 16..271    the 256 single bytes: byte b is id 16 + b,
**   ids 272..V-1   merged tokens, in the order training first created them.
** A merge whose result bytes already name a token reuses that id (as Hugging Face does), so
** the merge list may be longer than V - 272.
**
** Pre-tokenization (the exact rule; merges never cross a chunk boundary). Bytes are classed
**   D digit   '0'..'9'
**   L letter  'A'..'Z', 'a'..'z' and every byte >= 0x80 (so UTF-8 sequences stay together)
**   W space   ' ' '\t' '\n' '\v' '\f' '\r'
**   P punct   every other byte (ASCII punctuation and control bytes, NUL included)
** and a text t[0..n) has a chunk boundary before position p (0 < p < n) iff
**   1. t[p-1] or t[p] is D                       -> every digit is its own chunk;
**   2. else both are W: boundary iff t[p] == ' ' and p+1 < n and t[p+1] is L or P
**                                                -> a space run gives its last ' ' to the
**                                                   word or punctuation run that follows;
**   3. else t[p-1] == ' ' and t[p] is L or P: no boundary   -> " word", " ..." ;
**   4. else boundary iff the classes of t[p-1] and t[p] differ.
** So chunks are: single digits, ' '?L+, ' '?P+, W+. Only t[p-1], t[p], t[p+1] decide a
** boundary; the parallel encoder relies on that locality. Special-token strings in text are
** plain bytes unless PRL_TOKENIZER_SPECIAL is passed, in which case each occurrence becomes
** its id and also ends/starts a chunk.
**
** Imported Hugging Face tokenizers (tokenizer_hf*.c) have their own vocabulary and rules:
** the layout and pre-tokenization above are prl's own tokenizer's only.
**
** Ownership and threads: a prl_tokenizer is immutable after train/load/init_bytes, so any
** number of threads may encode and decode with it at once. Every array a function returns
** through an `out` pointer is malloc'ed and owned by the caller (release with free()); on
** error the out pointers are set to NULL/0. Errors: negative prl_status plus a message
** (prl_error_message) naming the file, token id, merge index or role at fault.
*/
#ifndef PRL_TOKENIZER_H
#define PRL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

/* Special token ids (never renumber: they are stored in every tokenizer.json and dataset). */
enum prl_tokenizer_special {
    PRL_TOKEN_PAD = 0,           /* <|pad|> */
    PRL_TOKEN_BOS = 1,           /* <|bos|> */
    PRL_TOKEN_EOS = 2,           /* <|eos|> */
    PRL_TOKEN_SYSTEM = 3,        /* <|system|>     starts a system turn */
    PRL_TOKEN_USER = 4,          /* <|user|>       starts a user turn */
    PRL_TOKEN_ASSISTANT = 5,     /* <|assistant|>  starts an assistant turn */
    PRL_TOKEN_TOOL = 6,          /* <|tool|>       starts a tool-result turn */
    PRL_TOKEN_END = 7,           /* <|end|>        ends any turn */
    PRL_TOKEN_TOOL_CALL = 8,     /* <|tool_call|> */
    PRL_TOKEN_TOOL_CALL_END = 9, /* <|/tool_call|> */
    PRL_TOKEN_THINK = 10,        /* <|think|> */
    PRL_TOKEN_THINK_END = 11,    /* <|/think|> */
    PRL_TOKEN_RESERVED_0 = 12,   /* <|reserved_0|> .. <|reserved_3|>: spares for later specials */
    PRL_TOKENIZER_N_SPECIAL = 16,
    PRL_TOKENIZER_BYTE0 = 16,  /* id of byte 0x00 */
    PRL_TOKENIZER_N_BASE = 272 /* specials + bytes: the vocabulary before any merge */
};

/* tokenizer.json "prl.format_version" written and accepted by this build. */
#define PRL_TOKENIZER_FORMAT_VERSION 1

/* Flags for encode/decode. */
enum prl_tokenizer_flags {
    PRL_TOKENIZER_SPECIAL = 1u,      /* encode: special-token strings in text become their ids
                                         (imported tokenizers: added tokens with special=false
                                         always do, as in Hugging Face) */
    PRL_TOKENIZER_NAIVE = 2u,        /* encode: the quadratic reference merge loop, no cache
                                         (tests compare the fast path against it) */
    PRL_TOKENIZER_SKIP_SPECIAL = 4u, /* decode: special ids produce no bytes */
    PRL_TOKENIZER_ADD_SPECIAL = 8u   /* encode, imported tokenizers: add the post-processor's
                                         tokens around the text (Hugging Face's
                                         add_special_tokens, e.g. Llama-2's <s>) */
};

typedef struct prl_tokenizer prl_tokenizer; /* opaque */

/* ---- construction ---------------------------------------------------------------------- */

/* A tokenizer with no merges (vocab 272): every byte is one token. *out owned by caller. */
prl_status prl_tokenizer_init_bytes(prl_tokenizer **out);

/* Learn merges on n_texts byte strings (lens[i] bytes each; lens == NULL means NUL-terminated)
** until the vocabulary has vocab_size ids (>= 272). Greedy by pair count over the chunk
** multiset; ties go to the lowest (left id, right id). Stops early, with a smaller vocabulary,
** only if no adjacent pair is left. Deterministic: same texts (in any order), same merges.
** The texts are only read. *out owned by caller. */
prl_status prl_tokenizer_train(const char *const *texts, const size_t *lens, size_t n_texts,
                               int32_t vocab_size, prl_tokenizer **out);

/* Release a tokenizer. Accepts NULL. */
void prl_tokenizer_free(prl_tokenizer *tok);

/* ---- inspection ------------------------------------------------------------------------ */

int32_t prl_tokenizer_vocab_size(const prl_tokenizer *tok);
size_t prl_tokenizer_n_merges(const prl_tokenizer *tok);
/* Merge number `rank` (0 = learned first): left + right -> result. */
prl_status prl_tokenizer_merge(const prl_tokenizer *tok, size_t rank, int32_t *left, int32_t *right,
                               int32_t *result);
/* The bytes of token `id` (a special's bytes are its string). *bytes points into tok. */
prl_status prl_tokenizer_token_bytes(const prl_tokenizer *tok, int32_t id, const uint8_t **bytes,
                                     size_t *len);
/* prl's own layout only: the id of a special-token string ("<|user|>"), or -1. For any
** tokenizer use prl_tokenizer_token_id / prl_tokenizer_role_id. */
int32_t prl_tokenizer_special_id(const char *name);
/* prl's own layout only: the string of special id 0..15 ("<|user|>"), or NULL. */
const char *prl_tokenizer_special_name(int32_t id);

/* What a token is for, looked up per tokenizer: prl's own tokenizer has the PRL_TOKEN_* ids;
** an imported Hugging Face one takes pad/bos/eos/unk from tokenizer_config.json (bos also from
** a TemplateProcessing post-processor) and END from its chat template's end-of-turn marker
** (<|im_end|>, <|eot_id|>, DeepSeek's end of sentence). */
typedef enum prl_tokenizer_role {
    PRL_ROLE_PAD,
    PRL_ROLE_BOS,
    PRL_ROLE_EOS,
    PRL_ROLE_UNK,
    PRL_ROLE_END, /* ends a chat turn (prl: <|end|>) */
    PRL_ROLE_COUNT
} prl_tokenizer_role;

/* The id of `role` in tok, or -1 when the tokenizer has none (Qwen has no bos). */
int32_t prl_tokenizer_role_id(const prl_tokenizer *tok, prl_tokenizer_role role);
/* The ids that end a model turn: END then EOS, distinct and present ones only. Returns how
** many (0..2) were written to out. */
int prl_tokenizer_stop_ids(const prl_tokenizer *tok, int32_t out[2]);
/* The id of the token `content`: an added token such as "<|im_start|>", else the first id
** whose decoded bytes are content; prl's own: its special strings. -1 if none. */
int32_t prl_tokenizer_token_id(const prl_tokenizer *tok, const char *content);
/* 1 if tok was imported from a Hugging Face tokenizer.json (no "prl" object), else 0. */
int prl_tokenizer_is_imported(const prl_tokenizer *tok);
/* End of the pre-tokenization chunk that starts at `pos` (pos < len), per the rule above. */
size_t prl_tokenizer_chunk_end(const void *text, size_t len, size_t pos);

/* ---- encode / decode ------------------------------------------------------------------- */

/* Encode len bytes (any bytes, NULs included) into *ids (*n_ids of them). flags: SPECIAL,
** NAIVE, ADD_SPECIAL. *ids is caller-owned, non-NULL on success even when *n_ids == 0.
** Imported tokenizers take valid UTF-8 only (PRL_ERR_ARG naming the byte offset), as
** Hugging Face's do, since their normalizers and regexes work on characters. */
prl_status prl_tokenizer_encode(const prl_tokenizer *tok, const void *text, size_t len,
                                unsigned flags, int32_t **ids, size_t *n_ids);

/* Multi-threaded encoding of long texts. The text is cut at nominal offsets k*chunk_bytes;
** each window extends overlap_bytes into both neighbours and is encoded on its own (windows
** are dealt to the threads in a fixed order); the results are joined at a byte offset in the
** overlap where both neighbours start a pre-tokenization chunk, away from the window edges,
** and where no such offset exists the left window is grown and re-encoded (tokenizer_parallel.c
** explains why this is exact). The result is identical to prl_tokenizer_encode for every
** input, flag, thread count, chunk size and overlap. */
typedef struct prl_tokenizer_parallel_opts {
    int n_threads;        /* worker threads (>= 1; 1 still runs the window algorithm) */
    size_t chunk_bytes;   /* nominal window size; 0 = max(64 KiB, len / (4 * n_threads)) */
    size_t overlap_bytes; /* how far each window reaches into its neighbours; 0 = 256 */
} prl_tokenizer_parallel_opts;

typedef struct prl_tokenizer_parallel_stats {
    size_t n_windows;       /* windows encoded by the workers */
    size_t n_grows;         /* times a window had to grow because no agreement point existed */
    size_t bytes_reencoded; /* bytes encoded again by those grows */
} prl_tokenizer_parallel_stats;

/* As prl_tokenizer_encode; opts NULL = defaults with 2 threads; stats may be NULL. */
prl_status prl_tokenizer_encode_parallel(const prl_tokenizer *tok, const void *text, size_t len,
                                         unsigned flags, const prl_tokenizer_parallel_opts *opts,
                                         int32_t **ids, size_t *n_ids,
                                         prl_tokenizer_parallel_stats *stats);

/* Concatenate the bytes of ids[0..n). *text is caller-owned and NUL-terminated (the NUL is
** not counted in *len). An id outside [0, vocab) is PRL_ERR_RANGE naming the id, its
** position and the vocab size. flags: SKIP_SPECIAL. */
prl_status prl_tokenizer_decode(const prl_tokenizer *tok, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *len);

/* The UTF-8 view of bytes s[0..n): every byte that does not start a valid UTF-8 sequence
** (stray continuation bytes, overlongs, surrogates, truncated sequences) becomes U+FFFD.
** Decoded model text can be any bytes; verifiers and JSON messages see this view of it, so
** both see the same string (the exact ids are what training keeps). *out is caller-owned and
** NUL-terminated, *out_len its length. Returns the number of replacements, or -1 (out of
** memory: *out NULL). */
long prl_utf8_view(const char *s, size_t n, char **out, size_t *out_len);

/* ---- chat encoding (SFT) --------------------------------------------------------------- */

/* One turn. role: "system", "user", "assistant" or "tool"; content: NUL-terminated text.
** Both are borrowed for the duration of the call. */
typedef struct prl_chat_message {
    const char *role;
    const char *content;
} prl_chat_message;

/* <|bos|> then per message <|role|> content <|end|>, then <|eos|>. loss_mask[i] is 1 exactly
** on the content tokens and <|end|> of assistant messages, and on the final <|eos|> when the
** last message is the assistant's; 0 elsewhere. Content special strings are plain bytes
** unless flags has PRL_TOKENIZER_SPECIAL (for trusted demonstrations with <|think|> etc.).
** *ids and *loss_mask are caller-owned; loss_mask may be NULL if not wanted. */
prl_status prl_tokenizer_encode_chat(const prl_tokenizer *tok, const prl_chat_message *msgs,
                                     size_t n_msgs, unsigned flags, int32_t **ids,
                                     uint8_t **loss_mask, size_t *n_ids);

/* prl_tokenizer_encode_chat with masked steps: an assistant message i with no_loss[i] = 1 is
** encoded the same but trained on nowhere (mask 0 on its content and end token; a step the
** environment rejected, kept as context for the recovery after it). no_loss [n_msgs] may be
** NULL (none masked). */
prl_status prl_tokenizer_encode_chat_steps(const prl_tokenizer *tok, const prl_chat_message *msgs,
                                           size_t n_msgs, const uint8_t *no_loss, unsigned flags,
                                           int32_t **ids, uint8_t **loss_mask, size_t *n_ids);

/* A JSON array of {"role", "content"} objects as turns that borrow the JSON strings (free
** *msgs only; the array must outlive them). Errors (PRL_ERR_FORMAT) start with `where`
** ("FILE:LINE", a message type) and name the bad turn. */
struct json_t;
prl_status prl_chat_from_json(const struct json_t *v, const char *where, prl_chat_message **msgs,
                              size_t *n);

/* The generation prompt: <|bos|>, the messages as above, then <|assistant|> (no <|eos|>). */
prl_status prl_tokenizer_encode_chat_prompt(const prl_tokenizer *tok, const prl_chat_message *msgs,
                                            size_t n_msgs, unsigned flags, int32_t **ids,
                                            size_t *n_ids);

/* One more non-assistant turn after a model turn, then the opening of the next assistant
** turn (prl: <|tool|> content <|end|> <|assistant|>): what an agent loop appends to the
** tokens after an observation. No bos. */
prl_status prl_tokenizer_encode_chat_turn(const prl_tokenizer *tok, const prl_chat_message *msg,
                                          unsigned flags, int32_t **ids, size_t *n_ids);

/* Imported tokenizers encode chat with the chat template of their tokenizer_config.json,
** recognised by its distinctive strings (no Jinja engine): ChatML (Qwen, <|im_start|>role\n
** content<|im_end|>\n), Llama-3 (<|start_header_id|>role<|end_header_id|>\n\ncontent
** <|eot_id|>, content trimmed) and DeepSeek-V3 (bos, system text, <｜User｜>content,
** <｜Assistant｜>content<｜end▁of▁sentence｜>), with the details of docs/tokenizer.md; checked
** against the real templates rendered by Hugging Face's Jinja engine. The loss mask covers
** assistant content and its end token. Without a recognised template chat encoding is an
** error naming the file. */

/* ---- files ----------------------------------------------------------------------------- */

/* Write a Hugging Face style tokenizer.json (docs/tokenizer.md) atomically: path.tmp, fsync,
** rename, fsync of the directory. An imported tokenizer writes back the bytes of the file it
** was loaded from (and its tokenizer_config.json beside path, when it had one). */
prl_status prl_tokenizer_save(const prl_tokenizer *tok, const char *path);

/* Read and fully validate a tokenizer.json. With a "prl" object: one written by
** prl_tokenizer_save (format version, special tokens, byte tokens, duplicate/missing ids,
** every merge). Without: a Hugging Face BPE tokenizer.json, imported (tokenizer_hf.c; what is
** supported is in docs/tokenizer.md; anything else is an error naming it), with the
** tokenizer_config.json beside it when present (roles, chat template). *out owned by caller. */
prl_status prl_tokenizer_load(const char *path, prl_tokenizer **out);

#endif /* PRL_TOKENIZER_H */
