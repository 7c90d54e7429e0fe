/* Fuzz target cli-input: tw_jsondoc_parse, the gate for the JSON documents users give the CLI
 * (submit --input / --input-file, tool-result --output). Whatever it accepts is sent to PostgreSQL as
 * jsonb after json_dumps, so an accepted document must dump and load back unchanged; whatever it
 * refuses must come with a reason that can be printed. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "jsondoc.h"
#include "names.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A copy exactly as long as the input, so ASan sees a read past it (the parser must not need a NUL). */
    char *buf = malloc(size ? size : 1), why[200];
    json_t *any, *obj;

    if (size)
        memcpy(buf, data, size);
    why[0] = '\0';
    any = tw_jsondoc_parse(buf, size, 0, why, sizeof why);
    if (any) {
        fz_check(size <= TW_DOC_MAX, "a document over the limit was accepted");
        fz_check_json(any);
        fz_check(memchr(data, 0, size) == NULL, "a document with a NUL byte was accepted");
    } else {
        fz_check(*why && fz_utf8_valid(why, strlen(why)), "refused without a printable reason");
    }
    why[0] = '\0';
    obj = tw_jsondoc_parse(buf, size, TW_JSONDOC_OBJECT, why, sizeof why);
    fz_check(!obj == !(any && json_is_object(any)), "the object flag disagrees with the parse");
    if (obj)
        fz_check(json_equal(obj, any), "two parses of one document differ");
    else
        fz_check(*why && fz_utf8_valid(why, strlen(why)), "refused without a printable reason");
    /* A short reason buffer is cut on a character boundary, never inside one. */
    json_decref(obj);
    if (!(obj = tw_jsondoc_parse(buf, size, 0, why, 7)))
        fz_check(fz_utf8_valid(why, strlen(why)), "a cut reason is not valid UTF-8");
    json_decref(any);
    json_decref(obj);
    free(buf);
    return 0;
}
