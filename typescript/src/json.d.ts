/** How deeply a request or a reply may nest arrays and objects. */
export declare const MAX_DEPTH: number;
