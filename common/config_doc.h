/* The configuration's documentation, generated from the parameter table (config_table.h): the shipped
 * config/turnwatch.ini and the manual page turnwatch.ini(5). tools/mangen.c prints them at build time; the
 * configuration's unit test compares them with the committed file and the built page. */
#ifndef TW_CONFIG_DOC_H
#define TW_CONFIG_DOC_H

/** config/turnwatch.ini: every key at its default with its meaning as comments, the [agent.NAME] and
 *  [tool.NAME] sections as commented templates. Malloc'd; NULL when out of memory. */
char *tw_config_doc_ini(void);
/** turnwatch.ini(5) in scdoc's syntax: every key with its section, type, bounds, enum values, default,
 *  reload class and meaning. Malloc'd; NULL when out of memory. */
char *tw_config_doc_man(void);

#endif
