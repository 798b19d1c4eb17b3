/*
** tokenizer_int.h — private to the tokenizer's sources (engine/tokenizer*.c, see
** tokenizer.c): the tokenizer's state (struct prl_tokenizer), its hash maps, the per-call
** encoder, an imported Hugging Face tokenizer's state (its pipeline as steps, added tokens,
** chat shape), and the few functions one part calls in another. Include engine/engine.h from
** outside; the tokenizer's API is engine/tokenizer.h.
*/
#ifndef PRL_TOKENIZER_INT_H
#define PRL_TOKENIZER_INT_H

#include "engine/engine.h"

/* ============================================================ specials ================ */

/* Longest special string (strlen("<|/tool_call|>")); the parallel encoder's safety margin
** must exceed it (tokenizer_parallel.c). Checked against the table in the tests. */
enum { SPECIAL_MAX_LEN = 14 };

/* The special strings by id (tokenizer.h). */
extern const char *const tok__special_names[PRL_TOKENIZER_N_SPECIAL];

/* ============================================================ hashing ================= */

static inline uint64_t tok__pair_key(int32_t left, int32_t right)
{
    return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

/* (left, right) key -> int32 value; open addressing, linear probing. */
typedef struct pair_map {
    uint64_t *keys;
    int32_t *vals;
    size_t cap, n; /* cap is a power of two (or 0); n <= cap / 2 */
} pair_map;

/* Byte string (borrowed, must outlive the map) -> int64 value. */
typedef struct bytes_entry {
    const uint8_t *key; /* NULL = empty slot (empty strings are never stored) */
    size_t len;
    uint64_t hash;
    int64_t val;
} bytes_entry;

typedef struct bytes_map {
    bytes_entry *e;
    size_t cap, n;
} bytes_map;

/* ============================================================ vocabulary ============== */

struct prl_tokenizer {
    int32_t vocab_size;
    size_t *tok_off;    /* token id's bytes are tok_bytes[tok_off[id] .. tok_off[id + 1]) */
    uint8_t *tok_bytes; /* every token's bytes back to back (specials: their strings) */
    size_t tok_cap, bytes_cap, bytes_len;
    int32_t *merges; /* 3 per merge in rank order: left, right, result */
    size_t n_merges, merges_cap;
    pair_map ranks;                /* tok__pair_key(left, right) -> rank (index into merges) */
    int32_t roles[PRL_ROLE_COUNT]; /* token id of each role (tokenizer.h), -1 if none */
    struct hf_tokenizer *hf;       /* an imported Hugging Face tokenizer (below); NULL
                                      for prl's own, whose layout is the one above */
};

static inline size_t tok__len(const prl_tokenizer *t, int32_t id)
{
    return t->tok_off[id + 1] - t->tok_off[id];
}

static inline const uint8_t *tok__ptr(const prl_tokenizer *t, int32_t id)
{
    return t->tok_bytes + t->tok_off[id];
}

/* ============================================================ encoder ================= */

/* Chunk cache: chunk bytes -> token ids, per encoder (so per call and per thread). Common
** words repeat, and a hit skips the merge loop. Bounded: when full it is simply cleared. */
enum {
    CACHE_SLOTS = 8192, /* hash slots (power of two) */
    CACHE_MAX_ENTRIES = 4096,
    CACHE_MAX_KEY = 32,   /* longer chunks are rare and mostly unique: not cached */
    CACHE_MIN_TEXT = 4096 /* shorter texts do not pay for the cache's allocation */
};

typedef struct cache_slot {
    uint64_t hash;
    uint32_t key_off, key_len; /* key_len 0 = empty */
    uint32_t ids_off, n_ids;
} cache_slot;

typedef struct chunk_cache {
    cache_slot *slots;
    uint8_t *keys; /* CACHE_MAX_ENTRIES * CACHE_MAX_KEY bytes */
    int32_t *ids;  /* same count of ids: a chunk never has more tokens than bytes */
    uint32_t n, keys_len, ids_len;
} chunk_cache;

/* One heap entry of the fast merge loop: the pair starting at symbol `pos` has `rank`. */
typedef struct merge_entry {
    int32_t rank, pos;
} merge_entry;

typedef struct encoder {
    const prl_tokenizer *tok;
    unsigned flags;
    int32_t *ids;    /* output */
    uint8_t *starts; /* per output token: 1 if it begins a chunk (parallel windows only) */
    size_t n, cap;
    int want_starts;
    /* scratch for one chunk */
    int32_t *sym, *next, *prev;
    merge_entry *heap;
    size_t scratch_cap;
    chunk_cache cache;  /* slots == NULL: no cache */
    struct hf_run *run; /* imported tokenizers: regex match state, made on first use */
} encoder;

/* ============================================================ imported (Hugging Face) = */
/* An imported tokenizer.json runs Hugging Face's pipeline: split the text on added tokens,
** normalize each piece, pre-tokenize it into words, BPE each word, and decode through the
** decoder chain. Each component of the file becomes a list of steps. */

typedef enum hf_step_kind {
    /* normalizers */
    HF_NFC,
    HF_NFD,
    HF_NFKC,
    HF_NFKD,
    HF_PREPEND,
    HF_REPLACE, /* also a decoder */
    /* pre-tokenizers */
    HF_SPLIT,
    HF_BYTE_LEVEL, /* also a decoder */
    HF_DIGITS,
    HF_METASPACE, /* also a decoder */
    /* decoders */
    HF_BYTE_FALLBACK,
    HF_FUSE,
    HF_STRIP
} hf_step_kind;

/* How a Split keeps its matches (Hugging Face's SplitDelimiterBehavior). */
typedef enum hf_behavior {
    HF_REMOVED,
    HF_ISOLATED,
    HF_MERGED_WITH_PREVIOUS,
    HF_MERGED_WITH_NEXT,
    HF_CONTIGUOUS
} hf_behavior;

typedef struct hf_step {
    hf_step_kind kind;
    void *re;   /* pcre2_code: Split, Replace with a Regex, ByteLevel's GPT-2 regex */
    char *text; /* Prepend text, Replace content, Metaspace replacement, Strip content */
    size_t text_len;
    char *pattern; /* Replace: a String pattern (re == NULL) */
    size_t pattern_len;
    hf_behavior behavior; /* Split, Digits */
    int invert;           /* Split */
    int flag;             /* ByteLevel add_prefix_space; Metaspace: prepend scheme (below) */
    int split;            /* Metaspace: split on the replacement */
    int start, stop;      /* Strip */
} hf_step;

enum { HF_PREPEND_NEVER, HF_PREPEND_FIRST, HF_PREPEND_ALWAYS }; /* Metaspace prepend_scheme */

/* An added token (tokenizer.json "added_tokens"). */
typedef struct hf_added {
    int32_t id;
    const uint8_t *content; /* matched text: the content, normalized when `normalized` */
    size_t len;
    uint8_t special, normalized, lstrip, rstrip, single_word;
} hf_added;

/* The chat shapes recognised in tokenizer_config.json's chat_template (tokenizer_hf_chat.c). */
typedef enum hf_chat_shape {
    HF_CHAT_NONE,    /* no tokenizer_config.json, or no chat_template in it */
    HF_CHAT_UNKNOWN, /* a template prl does not recognise: chat encoding says so */
    HF_CHAT_CHATML,
    HF_CHAT_LLAMA3,
    HF_CHAT_DEEPSEEK
} hf_chat_shape;

typedef struct hf_tokenizer {
    char *json, *config; /* the files as read (config may be NULL): save writes them back */
    size_t json_len, config_len;
    char *config_path; /* where tokenizer_config.json was read from, for messages */
    /* model */
    int byte_level; /* words are BPE'd as bytes (a ByteLevel pre-tokenizer is present) */
    int byte_fallback, ignore_merges, fuse_unk;
    int32_t unk_id;
    int32_t byte_id[256]; /* byte-level: the id of each byte; byte_fallback: of <0xXX>; -1 */
    bytes_map model_ids;  /* BPE's vocabulary: a word piece (raw bytes when byte-level, UTF-8
                             otherwise) -> id */
    uint8_t *model_bytes; /* the keys of model_ids back to back */
    uint8_t *is_special;  /* per id: an added token with special = true */
    /* pipeline */
    hf_step *norm, *pre, *dec;
    size_t n_norm, n_pre, n_dec;
    size_t dec_join;     /* dec[0..dec_join) run per token, the rest on the joined text */
    int dec_strip_first; /* Metaspace decoder: drop the first token's leading space */
    hf_added *added;     /* sorted by content length, longest first (leftmost-longest) */
    size_t n_added;
    uint32_t *by_byte; /* indices into added grouped by first byte, longest first */
    uint32_t by_byte_start[257];
    uint8_t *added_bytes;
    int32_t post_pre[4], post_post[4]; /* post-processor tokens before / after the text */
    int n_post_pre, n_post_post;
    hf_chat_shape chat;
    int32_t chat_ids[8]; /* the template's marker tokens (tokenizer_hf_chat.c) */
    int chat_qwen_tool;  /* ChatML: tool turns wrapped in <tool_response> (Qwen) */
    int chat_qwen_think; /* ChatML: Qwen3's empty thinking block on the final assistant turn */
} hf_tokenizer;

/* ---- tokenizer_chat.c ---------------------------------------------------------------- */

/* An encoder plus the loss mask kept in step with its output. */
typedef struct chat_buf {
    encoder e;
    uint8_t *mask;
    size_t mask_cap;
} chat_buf;

/* Give the tokens appended since `from` the mask value v. */
prl_status tok__chat_mark(chat_buf *b, size_t from, uint8_t v);
/* Append token id with mask value v. */
prl_status tok__chat_special(chat_buf *b, int32_t id, uint8_t v);

/* Length of the UTF-8 sequence a lead byte starts (the text was validated before). */
static inline size_t tok__utf8_len(uint8_t c)
{
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* ---- tokenizer_hf.c ------------------------------------------------------------------ */

/* Import a parsed Hugging Face tokenizer.json (root) read from path, whose bytes are
** text[0..len) (copied). Errors name the field; the caller prefixes the file. */
prl_status tok__hf_load(const struct json_t *root, const char *path, const char *text, size_t len,
                        prl_tokenizer **out);
void tok__hf_free(hf_tokenizer *hf);
prl_status tok__hf_save(const prl_tokenizer *tok, const char *path);

/* ---- tokenizer_hf_parse.c ------------------------------------------------------------ */

/* Parse a normalizer / pre_tokenizer / decoder object (JSON null = none) into steps. */
prl_status tok__hf_parse_normalizer(const struct json_t *v, hf_tokenizer *hf);
prl_status tok__hf_parse_pre_tokenizer(const struct json_t *v, hf_tokenizer *hf);
prl_status tok__hf_parse_decoder(const struct json_t *v, hf_tokenizer *hf);
void tok__hf_steps_free(hf_step *s, size_t n);

/* ---- tokenizer_hf_steps.c ------------------------------------------------------------ */

/* Per-call regex match state (PCRE2 match data and JIT stack): a compiled pattern is shared
** by every thread, its match state is not. */
typedef struct hf_run hf_run;
prl_status tok__hf_run_new(hf_run **out);
void tok__hf_run_free(hf_run *r);

/* A growable list of pieces: spans [off[2i], off[2i+1]) of buf. */
typedef struct hf_pieces {
    uint8_t *buf;
    size_t len, cap;
    size_t *off;
    size_t n, ncap;
    int first; /* the list starts the text (Metaspace's "first" prepend scheme) */
} hf_pieces;

void tok__hf_pieces_free(hf_pieces *p);
prl_status tok__hf_pieces_push(hf_pieces *p, const uint8_t *b, size_t n);
/* Normalize s[0..n) into *out (a fresh buffer of *out_len bytes) with hf's normalizers. */
prl_status tok__hf_normalize(const hf_tokenizer *hf, hf_run *run, const uint8_t *s, size_t n,
                             uint8_t **out, size_t *out_len);
/* Run the pre-tokenizers on *p (replaced by the words). */
prl_status tok__hf_pre_tokenize(const hf_tokenizer *hf, hf_run *run, hf_pieces *p);
/* Apply the per-token decoder steps to a token string: its decoded bytes in *out. */
prl_status tok__hf_decode_token(const hf_tokenizer *hf, hf_run *run, const uint8_t *s, size_t n,
                                uint8_t **out, size_t *out_len);
/* Apply the joined-text decoder steps to text[0..*len) in place (it only shrinks). */
void tok__hf_decode_joined(const hf_tokenizer *hf, char *text, size_t *len);

/* ---- tokenizer_hf_encode.c ----------------------------------------------------------- */

/* Encode t[0..n) with an imported tokenizer honouring e->flags. */
prl_status tok__hf_encode_text(encoder *e, const uint8_t *t, size_t n);
/* BPE one word b[0..m) of an imported tokenizer into e->sym (room for m symbols is made by
** the caller); the number of ids in *n_out. */
prl_status tok__hf_word(encoder *e, const uint8_t *b, size_t m, size_t *n_out);

/* ---- tokenizer_hf_chat.c ------------------------------------------------------------- */

/* Recognise the chat template of tokenizer_config.json (root, NULL if absent) and the roles. */
prl_status tok__hf_chat_setup(prl_tokenizer *t, const struct json_t *config);
/* Chat encoding with the template (prompt: end with the assistant's opening; turn: one
** non-assistant message then the assistant's opening, no bos). */
prl_status tok__hf_encode_chat(const prl_tokenizer *tok, const prl_chat_message *msgs,
                               size_t n_msgs, const uint8_t *no_loss, unsigned flags, int mode,
                               int32_t **ids, uint8_t **loss_mask, size_t *n_ids);
enum { CHAT_FULL = 0, CHAT_PROMPT = 1, CHAT_TURN = 2 };

/* ---- tokenizer.c ---------------------------------------------------------------------- */

/* Position of the first special occurrence in t[from, len), or len; its id in *id. */
size_t tok__find_special(const uint8_t *t, size_t len, size_t from, int32_t *id);
uint64_t tok__hash_bytes(const uint8_t *p, size_t n);
void tok__pair_map_free(pair_map *m);
/* Value stored for key, or -1. */
int32_t tok__pair_map_get(const pair_map *m, uint64_t key);
/* The value slot of key, inserting it with value `init` if absent (*added = 1 then). */
prl_status tok__pair_map_upsert(pair_map *m, uint64_t key, int32_t init, int32_t **val, int *added);
void tok__bytes_map_free(bytes_map *m);
/* The value stored for key, or -1 if absent. */
int64_t tok__bytes_map_get(const bytes_map *m, const uint8_t *key, size_t len);
/* Entry for key (len > 0), inserted with value `init` if absent; valid until the next
** insertion. */
prl_status tok__bytes_map_upsert(bytes_map *m, const uint8_t *key, size_t len, int64_t init,
                                 bytes_entry **out, int *added);
/* Grow *buf (elements of `size` bytes, capacity *cap) to hold at least `need`; 0: no memory. */
int tok__grow_array(void *buf, size_t *cap, size_t need, size_t size);
/* Append a token with the given bytes; its id is the old vocab_size. */
prl_status tok__add_token(prl_tokenizer *t, const uint8_t *b, size_t n);
/* Append merge left + right -> result with the next rank (a ranked pair keeps its rank). */
prl_status tok__add_merge(prl_tokenizer *t, int32_t left, int32_t right, int32_t result);
/* A new tokenizer holding the 16 specials and the 256 bytes (ids as in tokenizer.h). */
prl_status tok__new_base(prl_tokenizer **out);

/* The roles of prl's fixed layout (PRL_TOKEN_*). */
void tok__prl_roles(prl_tokenizer *t);

/* ---- tokenizer_encode.c --------------------------------------------------------------- */

/* Merge e->sym[0..m) (token ids) by rank with the loop the flags ask for; the new count. */
size_t tok__bpe(encoder *e, size_t m);

void tok__encoder_free(encoder *e);
/* Set up an encoder; text_len sizes the first output buffer and decides on the cache. */
prl_status tok__encoder_init(encoder *e, const prl_tokenizer *tok, unsigned flags, size_t text_len,
                             int want_starts);
/* Append ids[0..n) of one chunk (the first begins the chunk). */
prl_status tok__encoder_emit(encoder *e, const int32_t *ids, size_t n);
/* Encode t[0..n) honouring e->flags (PRL_TOKENIZER_SPECIAL: specials cut the text). */
/* One word of an imported tokenizer through the chunk cache and tok__hf_word. */
prl_status tok__encode_word(encoder *e, const uint8_t *b, size_t m);
prl_status tok__encode_text(encoder *e, const uint8_t *t, size_t n);
/* The NULL checks of the encode entry points (fn names the caller); clears the outputs. */
prl_status tok__check_encode_args(const prl_tokenizer *tok, const void *text, size_t len,
                                  int32_t **ids, size_t *n_ids, const char *fn);
/* Hand the encoder's output to the caller (shrunk to fit) and free the rest. */
void tok__encoder_take(encoder *e, int32_t **ids, size_t *n_ids);

#endif /* PRL_TOKENIZER_INT_H */
