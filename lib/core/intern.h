/* Interned strings: one stable pointer per distinct string, for tags. Interned strings live in
 * metadata memory until the process exits, so a tag pointer stays valid wherever it was copied,
 * and tags compare by pointer. */
#ifndef WEFT_CORE_INTERN_H
#define WEFT_CORE_INTERN_H

/** The interned copy of `s` ("" for NULL); NULL only when the host is out of memory. Thread-safe. */
const char *weft__intern(const char *s);

#endif
